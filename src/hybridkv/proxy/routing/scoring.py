"""How many prompt tokens an engine would find cached: the engine's own hit rule
(``kv/coordinator_queries.py``) run on its ``EngineIndex`` instead of its prefix map.

::

    prompt    | block 0 | block 1 | ... | block k-1 | ... |last|
    full      every block 0..k-1 held
    sliding   the cdiv(W-1, B) blocks before k held (or all of 0..k-1)
    state     a checkpoint held at exactly k blocks
    hit       the largest k <= (N-1) // B every group accepts (fixed point), x B tokens

A tier unit (any medium but the device's, group None: it holds every group) is a restore
point at its end, so the tier hit is the largest k whose block k-1 is a held unit; the
prediction is the larger of the two. A shared medium (``SHARED_MEDIA``: the remote tier, one
Valkey behind every engine that has it) counts the units any engine announced, for every
engine that has announced units there itself (how the proxy knows it has the tier).
"""

from __future__ import annotations

from collections.abc import Container, Sequence

from hybridkv.kv_events.schema import MEDIUM_DEVICE
from hybridkv.proxy.routing.index import EngineIndex, GroupInfo

SHARED_MEDIA = frozenset({"REMOTE"})


def predict_hit_tokens(
    index: EngineIndex,
    groups: Sequence[GroupInfo],
    hashes: Sequence[bytes],
    num_tokens: int,
    block_size: int,
    peers: Sequence[EngineIndex] = (),
    landing: Container[bytes] = frozenset(),
) -> int:
    """The tokens this engine would not compute (0 when nothing is held); ``peers`` are the
    other engines' indexes, read for shared media only; ``landing``: block hashes held in
    every attention group once the prefills computing them landed (``--prefill-wait auto``)."""
    max_blocks = min((num_tokens - 1) // block_size, len(hashes))
    if max_blocks <= 0 or not (len(index) or landing):
        return 0
    held = _Held(index, landing)
    device = _device_hit(held, groups, hashes, max_blocks, block_size)
    tier = _tier_hit(index, hashes, max_blocks, peers)
    return max(device, tier) * block_size


class _Held:
    """The index's device keys, plus blocks landing in every attention group."""

    __slots__ = ("index", "landing")

    def __init__(self, index: EngineIndex, landing: Container[bytes]) -> None:
        self.index, self.landing = index, landing

    def holds(self, g: int, h: bytes) -> bool:
        return h in self.landing or self.index.holds(MEDIUM_DEVICE, g, h)


def _device_hit(
    index: _Held,
    groups: Sequence[GroupInfo],
    hashes: Sequence[bytes],
    max_blocks: int,
    block_size: int,
) -> int:
    num_blocks = max_blocks
    for g, info in enumerate(groups):
        if info.kind == "full_attention":
            num_blocks = _full_hit(index, g, hashes, num_blocks)
    others = [g for g, info in enumerate(groups) if info.kind != "full_attention"]
    # the engine's fixed point: each answer can only lower k; done once all accept it
    agreed = i = 0
    while others and agreed < len(others):
        g = others[i % len(others)]
        k = _group_hit(index, g, groups[g], hashes, num_blocks, block_size)
        agreed = 1 if k < num_blocks else agreed + 1
        num_blocks = k
        i += 1
    return num_blocks


def _group_hit(
    index: _Held,
    g: int,
    info: GroupInfo,
    hashes: Sequence[bytes],
    max_blocks: int,
    block_size: int,
) -> int:
    if info.kind == "mamba":
        return _state_hit(index, g, hashes, max_blocks)
    window = info.sliding_window or 1
    needed = -(-(window - 1) // block_size)
    return _sliding_hit(index, g, hashes, max_blocks, needed)


def _full_hit(index: _Held, g: int, hashes: Sequence[bytes], max_blocks: int) -> int:
    for k in range(max_blocks):
        if not index.holds(g, hashes[k]):
            return k
    return max_blocks


def _sliding_hit(
    index: _Held, g: int, hashes: Sequence[bytes], max_blocks: int, needed: int
) -> int:
    """Right to left: the first run of ``needed`` held blocks ends the hit; a shorter run
    from block 0 is a hit too."""
    if needed == 0:
        return max_blocks
    run, run_end = 0, max_blocks
    for k in range(max_blocks - 1, -1, -1):
        if index.holds(g, hashes[k]):
            run += 1
            if run == needed:
                return run_end
        else:
            run, run_end = 0, k
    return run_end


def _state_hit(index: _Held, g: int, hashes: Sequence[bytes], max_blocks: int) -> int:
    for k in range(max_blocks, 0, -1):
        if index.index.holds(MEDIUM_DEVICE, g, hashes[k - 1]):  # checkpoints never land
            return k
    return 0


def _tier_hit(
    index: EngineIndex, hashes: Sequence[bytes], max_blocks: int, peers: Sequence[EngineIndex]
) -> int:
    media = index.tier_media
    if not media:
        return 0
    sources = [(index, m) for m in media]
    sources += [(p, m) for m in media & SHARED_MEDIA for p in peers if p is not index]
    for k in range(max_blocks, 0, -1):
        if any(source.holds(m, None, hashes[k - 1]) for source, m in sources):
            return k
    return 0
