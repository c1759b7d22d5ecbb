"""Which block boundaries of a request need a state checkpoint, and what kind each one is.

A boundary T (a multiple of the block size) is *due* when it is a multiple of the checkpoint
interval (``PERIODIC``), the prompt's last block boundary (both ``floor((P-1)/B)*B`` — where
the same prompt resent resumes — and ``floor(P/B)*B`` — where a longer follow-up resumes), a
*junction*: the end of a full-attention prefix hit longer than the hit the state groups allowed
(saving there lets the next request with that prefix hit all of it: a head shared with an
earlier request, ``JUNCTION``), or a boundary the caller named (``cache_boundaries``, the end
of each chat message: ``CALLER``), rounded down to the block; positions past the prompt are
ignored.

Two ways to take the state at a due boundary T inside a prefill:

- *split steps* (``clip``): the step ends at T, so the live state is exactly the state at T
  when it is copied after the forward;
- *from the scan* (``due_inside``): the step runs on, and the chunked scan hands back the state
  at each due boundary inside the step (``StateCopy.at``), copied in the same forward.

The last boundary a finished request passed is kept through its trailing slot (see
``state_manager``), not through this policy.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum


class CheckpointKind(IntEnum):
    """Why a checkpoint exists (the book learns how often each kind is reused)."""

    PERIODIC = 0  # every state_checkpoint_interval tokens
    PROMPT = 1  # a prompt's end
    JUNCTION = 2  # the end of a full-attention hit longer than the state hit: a shared head
    CALLER = 3  # cache_boundaries and chat message ends
    FINISHED = 4  # a finished request's last state
    TURN_END = 5  # the last state of a finished request that named boundaries (a chat turn:
    # where its conversation's next turn resumes)


@dataclass(frozen=True, slots=True)
class RequestBoundaries:
    """A request's own due boundaries (sorted, > 0) and which of them the caller named."""

    due: tuple[int, ...] = ()
    caller: frozenset[int] = frozenset()
    junction: int = 0  # 0: none
    prompt_ends: frozenset[int] = frozenset()  # a named one here is a PROMPT, not CALLER


@dataclass(frozen=True, slots=True)
class CheckpointPolicy:
    block_size: int
    interval: int  # tokens, a multiple of block_size; 0 disables periodic checkpoints

    def __post_init__(self) -> None:
        if self.interval < 0 or self.interval % self.block_size:
            raise ValueError(
                f"state_checkpoint_interval={self.interval} must be 0 or a positive multiple "
                f"of the block size {self.block_size}"
            )

    def request_boundaries(
        self, num_prompt_tokens: int, junction: int, caller: tuple[int, ...] = ()
    ) -> RequestBoundaries:
        """The request-specific due boundaries: prompt ends, the junction, the caller's."""
        b = self.block_size
        ends = frozenset(
            t for t in ((num_prompt_tokens - 1) // b * b, num_prompt_tokens // b * b) if t
        )
        named = frozenset(t // b * b for t in caller if 0 < t // b * b <= num_prompt_tokens)
        due = tuple(sorted(t for t in ends | named | {junction // b * b} if t > 0))
        return RequestBoundaries(due, named, junction // b * b, ends)

    def is_due(self, boundary: int, extra: RequestBoundaries) -> bool:
        periodic = self.interval > 0 and boundary % self.interval == 0
        return periodic or boundary in extra.due

    def kind(self, boundary: int, extra: RequestBoundaries) -> CheckpointKind:
        if boundary in extra.caller and boundary not in extra.prompt_ends:
            return CheckpointKind.CALLER
        if boundary == extra.junction:
            return CheckpointKind.JUNCTION
        if boundary in extra.due:
            return CheckpointKind.PROMPT
        return CheckpointKind.PERIODIC

    def clip(self, start: int, end: int, extra: RequestBoundaries) -> int:
        """The first due boundary in (start, end), else ``end``."""
        best = end
        if self.interval > 0:
            best = min(best, (start // self.interval + 1) * self.interval)
        for t in extra.due:
            if start < t < best:
                best = t
                break
        return best

    def due_inside(self, start: int, end: int, extra: RequestBoundaries) -> list[int]:
        """Every due boundary in (start, end), ascending."""
        found = {t for t in extra.due if start < t < end}
        if self.interval > 0:
            first = (start // self.interval + 1) * self.interval
            found.update(range(first, end, self.interval))
        return sorted(found)
