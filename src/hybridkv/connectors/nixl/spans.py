"""Which tokens a transfer moves (pure token arithmetic; ``plan`` maps them onto pages).

The producer hands over the KV of tokens ``[0, E)`` and, for layouts with state groups, the
state at ``E``; the consumer computes ``[E, N)`` itself (at least the last prompt token, whose
logits give the first output token)::

    E = N - 1                         attention-only layouts
    E = floor((N - 1) / B) * B        layouts with state groups (B: the producer's block size)

Per group only what a step resuming at E reads is sent: full-attention groups every block
before E, sliding-window groups the blocks of the window ending at E plus one (so a consumer
with blocks up to twice as large still gets whole blocks), state groups one checkpoint. A
consumer with larger blocks gets its window's first block only in part; it must never hash it
(``first_whole_entry``): no block is ever hashed with bytes it does not hold.
"""

from __future__ import annotations

from collections.abc import Sequence

from hybridkv.connectors.nixl.layout import GroupDesc


def transfer_end(num_prompt_tokens: int, block_size: int, has_state: bool) -> int:
    if has_state:
        return (num_prompt_tokens - 1) // block_size * block_size
    return num_prompt_tokens - 1


def producer_first_block(group: GroupDesc, end: int, block_size: int) -> int:
    """The first table entry a producer keeps and sends for ``group``."""
    if not group.window:
        return 0
    return max(0, (max(0, end - group.window + 1) // block_size) - 1)


def first_held(table: list[int], first: int) -> int:
    """``first``, or the first entry after it holding a block: a chunk of the prefill that
    ended at E already freed the window's entries before E - W + 1 (``remove_skipped``), so
    the extra block ``producer_first_block`` keeps may be gone."""
    while first < len(table) and not table[first]:
        first += 1
    return first


def producer_kept_tokens(end: int, block_size: int) -> int:
    """The position whose window ``remove_skipped`` keeps = what ``producer_first_block`` keeps."""
    return max(0, end - block_size)


def consumer_range(
    group: GroupDesc, start: int, end: int, block_size: int, remote_first_token: int
) -> tuple[int, int]:
    """Tokens ``[lo, end)`` of ``group`` a consumer reads: after its local hit (``start``),
    inside the window's whole blocks, and where the producer still has data. Raises
    ValueError if the producer does not hold a token the step resuming at ``end`` reads."""
    need = needed_from(group, start, end)
    if not 0 <= remote_first_token <= need:
        raise ValueError(
            f"the producer holds tokens from {remote_first_token} on (remote_block_starts), "
            f"but resuming at token {end} needs them from {need}"
        )
    lo = max(start, remote_first_token)
    if group.window:
        lo = max(lo, max(0, end - group.window + 1) // block_size * block_size)
    return min(lo, end), end


def needed_from(group: GroupDesc, start: int, end: int) -> int:
    """The first token of ``group`` a step resuming at ``end`` after a local hit of ``start``
    tokens reads from the load (its window's first token, or ``start``)."""
    window_start = max(0, end - group.window + 1) if group.window else 0
    return min(max(start, window_start), end)


def first_whole_entry(
    group: GroupDesc, start: int, end: int, block_size: int, remote_first_token: int | None
) -> int:
    """The first table entry from which a load of ``[start, end)`` writes every token of each
    entry it fills (the last one up to ``end``: the consumer computes the rest).

    Entries between the local hit and it are filled only in part: with blocks more than twice
    the producer's, the window's first block starts before the first token the producer
    kept. Their bytes before ``lo`` were never loaded, so they must never be hashed (a later
    hit whose window reaches there would read them)::

        consumer blocks   |   entry k   |  entry k+1  |
        producer kept           [rf .............. end)
        loaded                  [lo ..............      entry k: partial -> k + 1

    ``remote_first_token`` None (the producer's block size unknown): only the tokens this
    step needs are assumed held."""
    if remote_first_token is None:
        remote_first_token = needed_from(group, start, end)
    lo, _ = consumer_range(group, start, end, block_size, remote_first_token)
    return -(-lo // block_size)


def first_whole_entries(
    groups: Sequence[GroupDesc],
    first_blocks: Sequence[int],
    remote_block_size: int,
    span: tuple[int, int],
    block_size: int,
) -> tuple[int, ...]:
    """``first_whole_entry`` per attention group of a load of ``span`` = [start, end), from
    the params' ``remote_block_starts`` and ``remote_block_size`` (0: unknown). Params the
    load will refuse (``consumer_range`` raises there too): no entry it fills is whole."""
    start, end = span
    try:
        return tuple(
            first_whole_entry(
                g, start, end, block_size, f * remote_block_size if remote_block_size else None
            )
            for g, f in zip(groups, first_blocks, strict=True)
        )
    except ValueError:
        return tuple(-(-end // block_size) for _ in groups)
