"""How loads ended, as a worker half reports them: ``LoadResult`` per request, folded into the
step's ``KVConnectorOutput`` (``output_from_results``); ``merge_output`` adds one report to
another (wrappers and fan-outs)."""

from __future__ import annotations

from dataclasses import dataclass, field

from hybridkv.step_io import KVConnectorOutput


@dataclass(slots=True)
class LoadResult:
    """How one request's load ended, as a worker half records it."""

    request_id: str
    is_async: bool
    invalid_blocks: dict[int, str] = field(default_factory=dict)  # block id -> reason
    state_reason: str | None = None
    request_reason: str | None = None


def merge_output(into: KVConnectorOutput, other: KVConnectorOutput) -> None:
    """Add ``other``'s report to ``into`` (the first reason given for an id is kept)."""
    into.finished_sending |= other.finished_sending
    into.finished_recving |= other.finished_recving
    for rid, reason in other.failed_recving.items():
        into.failed_recving.setdefault(rid, reason)
    for block_id, reason in other.invalid_block_ids.items():
        into.invalid_block_ids.setdefault(block_id, reason)
    for rid, reason in other.invalid_state.items():
        into.invalid_state.setdefault(rid, reason)


def output_from_results(results: list[LoadResult]) -> KVConnectorOutput:
    """The step report for finished loads: async ones are finished receiving whatever their
    outcome (so the request leaves the wait state), failures by block, state and request."""
    output = KVConnectorOutput()
    for result in results:
        if result.is_async:
            output.finished_recving.add(result.request_id)
        output.invalid_block_ids.update(result.invalid_blocks)
        if result.state_reason is not None:
            output.invalid_state[result.request_id] = result.state_reason
        if result.request_reason is not None:
            output.failed_recving[result.request_id] = result.request_reason
    return output
