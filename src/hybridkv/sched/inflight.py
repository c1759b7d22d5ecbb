"""The in-flight prefix rule: a waiting request does not start computing blocks that a
running request's prefill is computing right now; it waits for them to land, then hits them.

::

    waiting  W: | hit | b_k | b_k+1 | ... |        W's hit ends at block k
    running  R: | shared chain ............ | ...  R has computed fewer tokens than the
                                                   blocks W and R share (R's prompt part)
    -> W stays waiting this step (later requests may go first: it holds no seat)

Without it both requests compute the shared blocks side by side (twice the work, and the
second's hit depends on how far the first got when it was admitted: a router that predicted
the hit from the KV events could not know). With it the waiting request's hit is what the
running one leaves in the cache once its prefill is done: for a hybrid's state groups, the
checkpoints due there (``kv/coordinator_saves.py``). So on a hybrid it waits only if the
source has a checkpoint due inside the prefix it could hit (``has_due_checkpoint``: periodic,
a prompt end, the junction, the caller's boundaries); else nothing lands for it to hit, and
it is admitted at once.

Never a deadlock: a running request never waits for a waiting one, and the wait ends when
the source computed the shared chain, left the running list (finished, aborted, preempted)
or after ``MAX_WAIT_STEPS`` steps of waiting (then the request is admitted as it is).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from hybridkv.request import Request

MAX_WAIT_STEPS = 256  # a safety bound: the source's own prefill bounds the wait before it
# (request id, lo, hi): whether its computing tokens (lo, hi] leaves a longer hit there
Lands = Callable[[str, int, int], bool]


def every_block(req_id: str, lo: int, hi: int) -> bool:
    """Attention only: every full block a prefill computes is cached."""
    return True


@dataclass(slots=True)
class InflightStats:
    num_waits: int = 0  # requests that waited for an in-flight prefix (each once)
    num_wait_steps: int = 0  # schedule passes a request spent waiting
    num_expired: int = 0  # waits ended by MAX_WAIT_STEPS, not by the source
    hit_tokens_gained: int = 0  # admitted hit minus the hit when the wait began


@dataclass(slots=True)
class _Wait:
    steps: int
    first_hit: int


@dataclass(slots=True)
class InflightPrefixes:
    block_size: int
    enabled: bool = True
    lands: Lands = every_block  # the KV coordinator's ``has_due_checkpoint``
    stats: InflightStats = field(default_factory=InflightStats)
    _waits: dict[str, _Wait] = field(default_factory=dict)

    def should_wait(self, req: Request, hit_tokens: int, running: Sequence[Request]) -> bool:
        """Whether ``req`` (its hit ``hit_tokens``) waits this step for a running prefill."""
        if (
            not self.enabled
            or source(req, hit_tokens, running, self.block_size, self.lands) is None
        ):
            return self._admitted(req, hit_tokens)
        wait = self._waits.get(req.request_id)
        if wait is None:
            wait = self._waits[req.request_id] = _Wait(0, hit_tokens)
            self.stats.num_waits += 1
        if wait.steps >= MAX_WAIT_STEPS:
            self.stats.num_expired += 1
            return self._admitted(req, hit_tokens)
        wait.steps += 1
        self.stats.num_wait_steps += 1
        return True

    def _admitted(self, req: Request, hit_tokens: int) -> bool:
        wait = self._waits.pop(req.request_id, None)
        if wait is not None:
            self.stats.hit_tokens_gained += max(0, hit_tokens - wait.first_hit)
        return False

    def forget(self, request_id: str) -> None:
        """The request ended (aborted while it waited)."""
        self._waits.pop(request_id, None)

    @property
    def num_waiting(self) -> int:
        return len(self._waits)


def shared_blocks(a: Request, b: Request, start: int) -> int:
    """How many leading blocks the two requests share, knowing they differ at or after
    ``start`` (chained hashes: equal at block j means equal up to it)."""
    ha, hb = a.block_hashes, b.block_hashes
    k, end = start, min(len(ha), len(hb))
    while k < end and ha[k] == hb[k]:
        k += 1
    return k


def source(
    req: Request,
    hit_tokens: int,
    running: Sequence[Request],
    block_size: int,
    lands: Lands = every_block,
) -> Request | None:
    """The first running request still computing prompt blocks that ``req`` shares past its
    hit (within the tokens ``req`` may hit: all but its last), whose computing them leaves
    ``req`` a longer hit (``lands``: on a hybrid, a state checkpoint due there)."""
    first = hit_tokens // block_size
    max_blocks = (req.num_tokens - 1) // block_size
    if first >= max_blocks or first >= len(req.block_hashes):
        return None
    key = req.block_hashes[first]
    for other in running:
        hashes = other.block_hashes
        if other is req or len(hashes) <= first or hashes[first] != key:
            continue
        common = min(shared_blocks(req, other, first + 1), max_blocks)
        target = min(common * block_size, other.num_prompt_tokens)
        if other.num_computed_tokens < target and lands(other.request_id, hit_tokens, target):
            return other
    return None
