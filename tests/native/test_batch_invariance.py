"""Batch invariance of every native kernel, on every instruction-set variant this CPU runs
(``isa`` fixture): a row or request computed alone gives the same bits as inside a batch with
others (of other lengths), on 1 and on 2 threads. This is what lets cached, offloaded, recovered
and disaggregated runs equal the plain run token for token. (The skinny GEMM's own test,
``test_gemm.py``, checks it for tiles and remainders.) The page-copy checksum is one function
on every variant: a checksum written by one build is verified by another."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np
import pytest
import torch

from hybridkv.model.layers.rotary import RopeConfig, RotaryTable
from hybridkv.native import load_pagecopy
from hybridkv.native.attention import AttentionKernels, KernelTable, load_attention
from hybridkv.native.isa import runnable_isas
from hybridkv.native.rownorm import RowKernels, load_rownorm
from hybridkv.native.ssm import SsmKernels, load_ssm
from hybridkv.native.ssm_prefill import PrefillRows, SsmPrefillKernels, load_ssm_prefill
from tests.native.no_compiler import built_or_skip
from tests.native.test_ssm import make_mixer, step_case, step_weights

T = torch.Tensor


@pytest.fixture(params=[1, 2], ids=["1thread", "2threads"])
def threads(request: pytest.FixtureRequest) -> Iterator[int]:
    before = torch.get_num_threads()
    torch.set_num_threads(request.param)
    yield request.param
    torch.set_num_threads(before)


def assert_rows_alone_equal(batch: T, alone: Callable[[int], T], rows: list[int]) -> None:
    for r in rows:
        got = alone(r)
        assert torch.equal(got, batch[r : r + 1]), f"row {r} alone differs from its batch row"


def test_row_kernels(isa: str, threads: int) -> None:
    kernels: RowKernels = built_or_skip(load_rownorm(isa))
    gen = torch.Generator().manual_seed(1)
    x, res = torch.randn(300, 256, generator=gen), torch.randn(300, 256, generator=gen)
    w = torch.randn(256, generator=gen)
    res_batch = res.clone()
    batch = kernels.rms_norm(x, w, 1e-6, residual=res_batch)  # 300 x 256: the OpenMP branch

    def norm_alone(r: int) -> T:
        return kernels.rms_norm(x[r : r + 1], w, 1e-6, residual=res[r : r + 1].clone())

    assert_rows_alone_equal(batch, norm_alone, [0, 131, 299])
    gate_up = torch.randn(200, 1024, generator=gen) * 3
    for act in ("silu", "gelu_tanh"):
        acts = kernels.act_mul(gate_up, act)
        assert_rows_alone_equal(
            acts, lambda r, a=act: kernels.act_mul(gate_up[r : r + 1], a), [0, 77]
        )


def test_norm_and_rope(isa: str, threads: int) -> None:
    kernels: RowKernels = built_or_skip(load_rownorm(isa))
    table = RotaryTable(RopeConfig(theta=10000.0, dim=16), initial_len=512)
    gen = torch.Generator().manual_seed(2)
    positions = torch.randint(0, 512, (300,), generator=gen)
    qkv = torch.randn(300, 8, 16, generator=gen)
    scale = torch.randn(6, 16, generator=gen)

    def fused(rows: slice) -> T:
        view = qkv[rows].clone()
        args = (scale, 1e-6, table.cos, table.sin, positions[rows])
        return kernels.rms_norm_rope_(view[:, :6], *args).clone()

    batch = fused(slice(0, 300))
    assert_rows_alone_equal(batch, lambda r: fused(slice(r, r + 1)), [0, 150, 299])


def test_mamba_step(isa: str, threads: int) -> None:
    kernels: SsmKernels = built_or_skip(load_ssm(isa))
    mixer = make_mixer(8, 1, 32, 64, True)
    proj, tokens, slots, conv, states = step_case(mixer, 17, seed=3)  # the parallel branch
    weights = step_weights(mixer)

    def run(rows: slice) -> tuple[T, T]:
        c, s = conv.clone(), states.clone()
        y = torch.zeros(proj.shape[0], mixer.cfg.intermediate_size)
        kernels.mamba_step_((c, s), slots[rows], tokens[rows], proj, weights, y)
        return y[tokens[rows]], s[slots[rows]]

    batch_y, batch_states = run(slice(0, 17))
    for r in (0, 8, 16):
        y, state = run(slice(r, r + 1))
        assert torch.equal(y, batch_y[r : r + 1]) and torch.equal(state, batch_states[r : r + 1])


def test_mamba_prefill_scan(isa: str, threads: int) -> None:
    kernels: SsmPrefillKernels = built_or_skip(load_ssm_prefill(isa))
    gen = torch.Generator().manual_seed(4)
    heads, p, n, lens = 8, 32, 16, [1, 7, 45, 130, 16]
    starts = torch.cumsum(torch.tensor(lens) + 3, 0) - torch.tensor(lens)
    tokens = int(starts[-1]) + lens[-1]
    act = torch.randn(tokens, heads * p + 2 * n, generator=gen)
    dt, a = torch.rand(tokens, heads, generator=gen), -torch.rand(heads, generator=gen)
    d = torch.randn(heads, generator=gen)
    start_states = torch.randn(len(lens), heads, p, n, generator=gen)

    def scan(rows: list[int]) -> tuple[T, T]:
        states, y = start_states.clone(), torch.zeros(tokens, heads * p)
        picked = torch.tensor(rows)
        spec = PrefillRows(starts[picked], torch.tensor(lens)[picked], picked)
        kernels.ssd_scan_(states, spec, act, dt, a, d, 1, y)
        return y, states

    batch_y, batch_states = scan(list(range(len(lens))))
    for r in range(len(lens)):
        y, states = scan([r])
        span = slice(int(starts[r]), int(starts[r]) + lens[r])
        assert torch.equal(y[span], batch_y[span]), f"request {r} alone differs"
        assert torch.equal(states[r], batch_states[r])


def test_attention(isa: str, threads: int) -> None:
    """Decodes of uneven depths and a prompt chunk: each alone equals its rows in the step."""
    kernels: AttentionKernels = built_or_skip(load_attention(isa))
    gen = torch.Generator().manual_seed(6)
    contexts, chunk, blocks_each = [3, 40, 97, 150, 7, 120], 37, 10
    table = torch.arange(1, 1 + 7 * blocks_each).view(7, blocks_each)
    pages = torch.randn(7 * blocks_each + 1, 2, 16, 4, 64, generator=gen)
    token_rows = list(range(6)) + [6] * chunk
    positions = contexts + list(range(chunk))
    qkv = torch.randn(len(token_rows), 12 + 4 + 4, 64, generator=gen)

    def attend(requests: list[int]) -> T:
        picked = [t for t, r in enumerate(token_rows) if r in requests]
        rows = torch.tensor([requests.index(token_rows[t]) for t in picked])
        meta = KernelTable.checked(
            table[requests], rows, torch.tensor([positions[t] for t in picked]), None, 16,
            7 * blocks_each + 1,
        )  # fmt: skip
        q, k, v = qkv[picked, :12], qkv[picked, 12:16], qkv[picked, 16:]
        return kernels.forward(q, k, v, pages.clone(), meta, 0.125)

    batch = attend(list(range(7)))
    for r in (0, 3, 5):
        assert torch.equal(attend([r]), batch[r : r + 1]), f"decode {r} alone differs"
    assert torch.equal(attend([6]), batch[6:]), "the prompt chunk alone differs"


def test_page_checksum_is_one_function_on_every_variant() -> None:
    data = np.random.default_rng(0).integers(0, 256, (3, 4, 4096 + 96), dtype=np.uint8)
    sums = {isa: built_or_skip(load_pagecopy(isa)).hash(data) for isa in runnable_isas()}
    assert len(set(sums.values())) == 1, sums
