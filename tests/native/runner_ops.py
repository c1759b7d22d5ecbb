"""Helpers of the runner tests: one op record, and a program of ops run on a step of
``tokens`` rows (no attention or state groups; ``ids`` the step's token ids)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from hybridkv.native.runner import AttnGroup, Op, OpKind, ProgramRunner, StateGroup, Step


def make_op(kind: OpKind, p: Sequence[int | None], n: Sequence[int], f: Sequence[float] = ()) -> Op:
    op = Op()
    op.kind = kind
    op.p[: len(p)], op.n[: len(n)], op.f[: len(f)] = list(p), list(n), list(f)
    return op


def run_ops(
    runner: ProgramRunner, ops: list[Op], tokens: int, ids: torch.Tensor | None = None
) -> int:
    attn, states = (AttnGroup * 1)(), (StateGroup * 1)()
    step = Step(tokens, torch.get_num_threads(), None, attn, states)
    step.ids = None if ids is None else ids.data_ptr()
    return runner.run((Op * len(ops))(*ops), len(ops), step)
