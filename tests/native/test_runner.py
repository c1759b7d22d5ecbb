"""The decode program runner (``native/runner.c``): each op calls its kernel with the bound
arguments (the same bits as the kernel's own wrapper), ops run in order on the step's rows,
and a failing op stops the program and is named."""

from __future__ import annotations

import pytest
import torch

from hybridkv.native.gemm import load_gemm
from hybridkv.native.quant import load_quant
from hybridkv.native.quant_blocks import QuantFormat, pack
from hybridkv.native.rownorm import load_rownorm
from hybridkv.native.runner import (
    AttnGroup,
    Op,
    OpKind,
    ProgramRunner,
    StateGroup,
    Step,
)
from tests.native.no_compiler import built_or_skip
from tests.native.runner_ops import make_op, run_ops


def test_norm_and_gemm_ops_give_their_kernels_bits(runner: ProgramRunner, isa: str) -> None:
    gen = torch.Generator().manual_seed(0)
    rows, k, n = 3, 256, 96
    x, res = torch.randn(5, k, generator=gen), torch.randn(5, k, generator=gen)
    w, scale = torch.randn(n, k, generator=gen), torch.randn(k, generator=gen)
    packed = torch.from_numpy(pack(w.numpy(), QuantFormat.Q8_0))
    res_ref, x_ref = res[:rows].clone(), x[:rows].clone()
    normed_ref = built_or_skip(load_rownorm(isa)).rms_norm(
        x_ref, scale, 1e-6, residual=res_ref, x_scale=0.5
    )
    y_ref = built_or_skip(load_gemm(isa)).linear(normed_ref, w)
    q_ref = built_or_skip(load_quant(isa)).linear(normed_ref, packed, QuantFormat.Q8_0)
    normed, y, q = torch.zeros(5, k), torch.zeros(5, n), torch.zeros(5, n)
    ops = [
        make_op(OpKind.NORM, [x.data_ptr(), res.data_ptr(), scale.data_ptr(), normed.data_ptr()],
            [1, k, k, 1], [1e-6, 0.5]),
        make_op(OpKind.GEMM, [normed.data_ptr(), w.data_ptr(), None, y.data_ptr()], [k, n, k, -1, 0]),
        make_op(OpKind.GEMM, [normed.data_ptr(), packed.data_ptr(), None, q.data_ptr()],
            [k, n, k, QuantFormat.Q8_0.layout.ggml_type, 0]),
    ]  # fmt: skip
    assert run_ops(runner, ops, rows) == 0
    assert torch.equal(res[:rows], res_ref) and torch.equal(normed[:rows], normed_ref)
    assert torch.equal(y[:rows], y_ref) and torch.equal(q[:rows], q_ref)
    assert not normed[rows:].any() and not y[rows:].any()  # only the step's rows


def test_a_failing_op_stops_the_program_and_is_named(runner: ProgramRunner) -> None:
    src, dst, late = torch.arange(8.0).view(2, 4), torch.zeros(2, 4), torch.zeros(2, 4)
    copy = make_op(OpKind.COPY, [src.data_ptr(), dst.data_ptr()], [4, 4, 4])
    after = make_op(OpKind.COPY, [src.data_ptr(), late.data_ptr()], [4, 4, 4])
    assert run_ops(runner, [copy, make_op(99, [], []), after], 2) == 2  # 1 + the bad op's index
    assert torch.equal(dst, src) and not late.any()


def test_a_state_slot_out_of_range_fails_before_any_write(runner: ProgramRunner) -> None:
    heads, p_dim, n_dim, k, slots = 2, 4, 4, 4, 3
    inner, channels = heads * p_dim, heads * p_dim + 2 * n_dim
    conv, ssm = torch.ones(slots, channels, k - 1), torch.ones(slots, heads, p_dim, n_dim)
    proj = torch.ones(1, inner + channels + heads)
    weights = [torch.ones(channels, k), torch.ones(channels), *(torch.ones(heads),) * 3]
    scratch, y, norm_w = (
        torch.zeros(channels + heads + inner),
        torch.zeros(1, inner),
        torch.ones(inner),
    )
    bad_slot, token = torch.tensor([slots], dtype=torch.int64), torch.tensor([0], dtype=torch.int64)
    p = [conv.data_ptr(), ssm.data_ptr(), proj.data_ptr(), *(w.data_ptr() for w in weights),
         scratch.data_ptr(), y.data_ptr(), norm_w.data_ptr()]  # fmt: skip
    n = [proj.shape[1], inner, inner + channels, inner, slots, heads, 1, p_dim, n_dim, k, 1, 1, 0]
    attn, states = (AttnGroup * 1)(), (StateGroup * 1)()
    states[0].slots, states[0].tokens, states[0].rows = bad_slot.data_ptr(), token.data_ptr(), 1
    ops = (Op * 1)(make_op(OpKind.MAMBA, p, n, [1e-3, 1e2, 1e-6]))
    assert runner.run(ops, 1, Step(1, 1, None, attn, states)) == 1
    assert torch.equal(conv, torch.ones_like(conv)) and not y.any()
    with pytest.raises(ValueError):
        runner.run(ops, 2, Step(1, 1, None, attn, states))
