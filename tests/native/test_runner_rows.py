"""The decode program's end ops (``native/runner_rows.h``): the embedding lookup (float32 or
GGUF rows, with the family's scaling), the logits' division and the greedy argmax give the
Python step's values: ``table[ids] * scale`` by torch, ``x / s`` by torch, numpy's argmax."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest
import torch

from hybridkv.native.quant import load_quant
from hybridkv.native.quant_blocks import QuantFormat, pack
from hybridkv.native.runner import (
    OpKind,
    ProgramRunner,
    Step,
)
from tests.native.no_compiler import built_or_skip
from tests.native.runner_ops import make_op, run_ops


def _embed(runner: ProgramRunner, table: torch.Tensor, fmt: QuantFormat | None, k: int,
           ids: torch.Tensor, scale: float | None) -> tuple[int, torch.Tensor]:  # fmt: skip
    out = torch.full((5, k), 7.0)
    ggml, row_bytes = (-1, 0) if fmt is None else (fmt.layout.ggml_type, table.shape[1])
    n = [k, table.shape[0], ggml, row_bytes, k, int(scale is not None)]
    op = make_op(OpKind.EMBED, [table.data_ptr(), out.data_ptr()], n, [scale or 0.0])
    return run_ops(runner, [op], ids.shape[0], ids), out


@pytest.mark.parametrize("fmt", [None, QuantFormat.Q8_0, QuantFormat.Q4_K, QuantFormat.Q6_K])
@pytest.mark.parametrize("scale", [None, 2048**0.5, 0.3])
def test_embed_gives_the_rows_the_python_lookup_gives(
    runner: ProgramRunner, isa: str, fmt: QuantFormat | None, scale: float | None
) -> None:
    gen = torch.Generator().manual_seed(1)
    vocab, k = 40, 512
    values = torch.randn(vocab, k, generator=gen)
    table = values if fmt is None else torch.from_numpy(pack(values.numpy(), fmt))
    ids = torch.tensor([3, 39, 0, 3], dtype=torch.int64)
    failed, out = _embed(runner, table, fmt, k, ids, scale)
    assert failed == 0
    rows = (
        table[ids] if fmt is None else built_or_skip(load_quant(isa)).dequantize(table[ids], fmt, k)
    )
    if scale is None:
        assert torch.equal(out[:4], rows)
    else:  # Gemma 3 multiplies by a float32 tensor, Granite by a float
        assert torch.equal(out[:4], rows * torch.tensor(scale, dtype=torch.float32))
        assert torch.equal(out[:4], rows * scale)
    assert torch.equal(out[4], torch.full((k,), 7.0))  # rows past the step untouched


def test_embed_refuses_a_token_outside_the_table(runner: ProgramRunner) -> None:
    table = torch.zeros(10, 32)
    for bad in (10, -1):
        failed, out = _embed(runner, table, None, 32, torch.tensor([1, bad]), None)
        assert failed == 1
        assert torch.equal(out[1], torch.full((32,), 7.0))


def test_div_divides_as_torch(runner: ProgramRunner) -> None:
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(3, 1003, generator=gen) * 50
    ref = x[:2] / 7.3
    op = make_op(OpKind.DIV, [x.data_ptr()], [1003, 1003], [7.3])
    assert run_ops(runner, [op], 2) == 0
    assert torch.equal(x[:2], ref)
    assert not torch.equal(x[2], x[2] / 7.3)  # the third row is not the step's


def _argmax(runner: ProgramRunner, x: torch.Tensor) -> tuple[list[int], list[float]]:
    rows, n = x.shape
    index, value = torch.full((rows,), -5, dtype=torch.int64), torch.zeros(rows)
    op = make_op(OpKind.ARGMAX, [x.data_ptr(), index.data_ptr(), value.data_ptr()], [n, n], [])
    assert run_ops(runner, [op], rows) == 0
    return index.tolist(), value.tolist()


@pytest.mark.parametrize("n", [1, 7, 8, 33, 1000, 32768 + 5])
def test_argmax_is_numpys(runner: ProgramRunner, n: int) -> None:
    gen = torch.Generator().manual_seed(n)
    x = torch.randint(-40, 40, (6, n), generator=gen).float() / 8  # many ties
    x[1] = -1.0
    x[2, n // 2 :] = 1e9  # the first of a run of maxima
    x[3, -1] = 1e9  # the maximum last (a tail element)
    index, value = _argmax(runner, x)
    ref = x.numpy().argmax(axis=1)
    assert index == ref.tolist()
    assert value == [float(x[r, i]) for r, i in enumerate(ref)]


def test_argmax_reports_rows_with_nan_or_no_finite_maximum(runner: ProgramRunner) -> None:
    x = torch.randn(4, 300)
    x[0, 260] = float("nan")
    x[1, 17] = float("inf")
    x[2] = float("-inf")
    index, value = _argmax(runner, x)
    assert index[:3] == [260, 17, 0] and np.isnan(value[0])
    assert value[1:3] == [float("inf"), float("-inf")]
    assert index[3] == int(x[3].argmax()) and np.isfinite(value[3])


def test_step_struct_carries_the_token_ids() -> None:
    assert Step.ids.offset == ctypes.sizeof(Step) - ctypes.sizeof(ctypes.c_void_p)
