"""What one ``schedule()`` call has decided so far: the token slices, and the budget left.

A slice ``[start, end)`` of a request's tokens is what it computes this step::

    | computed (num_computed_tokens) | this step: [start, end) | not yet |
    0                                ^ start                   ^ end

``StepPlan.add`` spends ``end - start`` of the budget; the scheduler only adds a slice once
the coordinator allocated room for it, so every slice in a plan holds its blocks.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hybridkv.request import Request


@dataclass(slots=True)
class StepSlice:
    request: Request
    start: int
    end: int


@dataclass(slots=True)
class StepPlan:
    """What one ``schedule()`` call has decided so far, and the tokens it may still spend."""

    tokens_left: int
    slices: list[StepSlice] = field(default_factory=list)

    def add(self, req: Request, start: int, end: int) -> None:
        self.slices.append(StepSlice(req, start, end))
        self.tokens_left -= end - start
