"""Which block boundaries of a request need a state checkpoint.

A boundary T (a multiple of the block size) is *due* when it is a multiple of the checkpoint
interval, the prompt's last block boundary (both ``floor((P-1)/B)*B`` — where the same prompt
resent resumes — and ``floor(P/B)*B`` — where a longer follow-up resumes), or a *junction*: the
end of a full-attention prefix hit longer than the hit the state groups allowed (saving there
lets the next request with that prefix hit all of it). Steps end at due boundaries, so the live
state is exactly the state at T when it is copied. The last boundary a finished request passed
is kept through its trailing slot (see ``state_manager``), not through this policy.
"""

from __future__ import annotations

from dataclasses import dataclass


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

    def request_boundaries(self, num_prompt_tokens: int, junction: int) -> tuple[int, ...]:
        """The request-specific due boundaries (sorted, > 0)."""
        b = self.block_size
        found = {(num_prompt_tokens - 1) // b * b, num_prompt_tokens // b * b, junction // b * b}
        return tuple(sorted(t for t in found if t > 0))

    def is_due(self, boundary: int, extra: tuple[int, ...]) -> bool:
        periodic = self.interval > 0 and boundary % self.interval == 0
        return periodic or boundary in extra

    def clip(self, start: int, end: int, extra: tuple[int, ...]) -> int:
        """The first due boundary in (start, end), else ``end``."""
        best = end
        if self.interval > 0:
            best = min(best, (start // self.interval + 1) * self.interval)
        for t in extra:
            if start < t < best:
                best = t
                break
        return best
