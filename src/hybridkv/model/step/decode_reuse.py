"""Decode input reuse: a decode step whose batch is the previous step's (the same requests in
the same order, each one token further, the same block tables and state slots: the
single-stream and steady-batch case) reuses that step's input tensors, updated in place (each
request's token id; positions and the largest one + 1), instead of building them from Python
lists again (``step_builder.build_step``). Any other step (a request joining, leaving or
preempted, a block appended or a sliding window's block released, a prefill, a mid-step state
save, the torch attention path) takes the full build, which becomes the next step's base when
it is a decode step on the kernels."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import torch

from hybridkv.kv.spec import KVCacheLayout
from hybridkv.model.layers.step_context import KernelAttnMeta, StepContext
from hybridkv.model.step.step_builder import StepInputs, build_step
from hybridkv.step_io import ScheduledRequest, StateCopy


@dataclass(slots=True)
class _Base:
    """The previous decode step: its inputs (whose tensors are updated in place) and what a
    next step must repeat to reuse them."""

    inputs: StepInputs
    ids: npt.NDArray[np.int64]  # input_ids' memory
    positions: npt.NDArray[np.int64]  # ctx.positions' memory (the kernels' tables read it)
    request_ids: list[str]
    tables: list[tuple[list[int], ...]]  # copies of each request's block tables
    slots: list[tuple[int, ...]]
    position_limit: int  # positions must stay below the tables' width * block size


class DecodeInputs:
    """``build(...)``: ``build_step``'s inputs, reused from the previous step where it can;
    ``reused`` / ``built`` count the steps of each kind."""

    def __init__(self) -> None:
        self._base: _Base | None = None
        self.reused = 0
        self.built = 0

    def build(
        self,
        requests: list[ScheduledRequest],
        layout: KVCacheLayout,
        kv_pages: dict[int, torch.Tensor],
        states: dict[int, tuple[torch.Tensor, ...]],
        saves: Sequence[StateCopy] = (),
    ) -> StepInputs:
        base = self._base
        if base is not None and _repeats(base, requests, saves):
            self.reused += 1
            return _advance(base, requests)
        self.built += 1
        inputs = build_step(requests, layout, kv_pages, states, saves)
        self._base = _base_of(inputs, requests, layout.block_size)
        return inputs


def _is_decode(requests: list[ScheduledRequest]) -> bool:
    return all(len(r.token_ids) == 1 and r.sample and not r.reset_state for r in requests)


def _repeats(base: _Base, requests: list[ScheduledRequest], saves: Sequence[StateCopy]) -> bool:
    """The same requests, one token on, nothing else changed (no mid-step save either)."""
    if len(requests) != len(base.request_ids) or not _is_decode(requests):
        return False
    if any(s.at is not None for s in saves):
        return False
    positions = base.positions
    for i, r in enumerate(requests):
        if r.request_id != base.request_ids[i] or r.start_pos != positions[i] + 1:
            return False
        if r.block_ids != base.tables[i] or r.state_slots != base.slots[i]:
            return False
    return int(positions.max()) + 1 < base.position_limit


def _advance(base: _Base, requests: list[ScheduledRequest]) -> StepInputs:
    base.ids[:] = [r.token_ids[0] for r in requests]
    base.positions += 1
    last, c = base.inputs, base.inputs.ctx
    ctx = StepContext(c.positions, c.max_position + 1, c.kv_pages, c.attn_meta, c.states,
                      c.state_meta)  # fmt: skip
    base.inputs = StepInputs(last.input_ids, ctx, last.sample_token_idx)
    return base.inputs


def _base_of(inputs: StepInputs, requests: list[ScheduledRequest], block_size: int) -> _Base | None:
    """What a next step may reuse of this one's inputs (None: not a decode step on the
    kernels' tables)."""
    metas = list(inputs.ctx.attn_meta.values())
    if not requests or not _is_decode(requests) or inputs.ctx.positions.numel() != len(requests):
        return None
    if not all(isinstance(m, KernelAttnMeta) for m in metas):
        return None
    if any(m.has_prefill or m.taps is not None for m in inputs.ctx.state_meta.values()):
        return None
    widths = {m.table.block_table.shape[1] for m in metas if isinstance(m, KernelAttnMeta)}
    limit = min(widths, default=1 << 40) * block_size
    return _Base(
        inputs,
        inputs.input_ids.numpy(),
        inputs.ctx.positions.numpy(),
        [r.request_id for r in requests],
        [tuple(list(t) for t in r.block_ids) for r in requests],
        [tuple(r.state_slots) for r in requests],
        limit,
    )
