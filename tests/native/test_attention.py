"""The native paged attention kernels against the pure-torch path (their reference): same page
writes, same outputs, for every page dtype, GQA ratio, window, soft-cap and sink choice, on a
ragged step (decodes at different depths, a prompt from 0, a chunk of a longer prompt). Slots
the step must not read hold NaN, so reading one shows. Bad tables are refused; without the
kernels (no compiler, ``HYBRIDKV_NATIVE=0``) the step builder takes the torch path."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from hybridkv.kv.spec import FullAttentionSpec, KVCacheLayout, SlidingWindowSpec, create_layout
from hybridkv.model.layers.attention import PagedAttention
from hybridkv.model.layers.step_context import AttnMeta, KernelAttnMeta
from hybridkv.model.step import step_builder
from hybridkv.model.step.cache_tensors import CacheTensors
from hybridkv.model.step.step_builder import StepInputs, build_step
from hybridkv.native import attention as native_attention
from hybridkv.native.attention import AttentionKernels, KernelTable
from hybridkv.sampling.params import SamplingParams
from hybridkv.step_io import ScheduledRequest
from tests.native.no_compiler import assert_unavailable_without_compiler, built_or_skip

B, D, WINDOW, NUM_BLOCKS = 4, 16, 6, 64
# (start position, tokens this step): decodes at several depths, a prompt, a prompt's chunk
SHAPE = [(0, 1), (9, 1), (0, 7), (5, 6), (22, 1), (13, 3)]


@pytest.fixture(scope="module")
def kernels(isa: str) -> AttentionKernels:
    return built_or_skip(native_attention.load_attention(isa))


def make_layout(kv_heads: int, dtype: str, d: int = D) -> KVCacheLayout:
    """Layer 0: full attention, head size d (its pages padded to layer 1's); layer 1: a
    sliding window, head size 2d."""
    return create_layout(
        [
            FullAttentionSpec(B, kv_heads, d, dtype),
            SlidingWindowSpec(B, kv_heads, 2 * d, dtype, WINDOW),
        ]
    )


def make_requests(shape: list[tuple[int, int]]) -> list[ScheduledRequest]:
    gen = torch.Generator().manual_seed(3)
    free = torch.randperm(NUM_BLOCKS - 1, generator=gen) + 1  # block 0 is the null block
    reqs, used = [], 0
    for i, (start, n) in enumerate(shape):
        tables = []
        for _ in range(2):  # groups share the backing tensors: their blocks differ
            tables.append(free[used : used + (start + n + B - 1) // B].tolist())
            used += len(tables[-1])
        reqs.append(
            ScheduledRequest(
                f"r{i}", [5] * n, start, tuple(tables), (), False, True, SamplingParams()
            )
        )
    return reqs


def filled_cache(layout: KVCacheLayout, reqs: list[ScheduledRequest]) -> CacheTensors:
    """Random K/V at every context position before each request's start, NaN everywhere
    else (the null block, unused blocks, slots past the context)."""
    cache = CacheTensors(layout, NUM_BLOCKS, 0)
    gen = torch.Generator().manual_seed(4)
    for pages in cache.kv_pages.values():
        pages.fill_(float("nan"))
    for layer_id, pages in cache.kv_pages.items():
        group = next(g.group_id for g in layout.groups if layer_id in g.layer_ids)
        for req in reqs:
            for pos in range(req.start_pos):
                block = req.block_ids[group][pos // B]
                slot = pages[block, :, pos % B]
                slot.copy_(torch.randn(slot.shape, generator=gen))
    return cache


def run_layer(
    layer_id: int,
    step: StepInputs,
    heads: int,
    kv_heads: int,
    qkv: tuple[torch.Tensor, ...],
    softcap: float | None,
    sinks: torch.Tensor | None,
    compute_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    d = step.ctx.kv_pages[layer_id].shape[-1]
    attn = PagedAttention(layer_id, heads, kv_heads, d, d**-0.5, softcap)
    attn.compute_dtype = compute_dtype
    q, k, v = (x[..., :d] for x in qkv)
    return attn(q.contiguous(), k.contiguous(), v.contiguous(), step.ctx, sinks)


def both_paths(
    kernels: AttentionKernels,
    page_dtype: str,
    heads: int,
    kv_heads: int,
    softcap: float | None,
    with_sinks: bool,
    act_dtype: torch.dtype,
    compute_dtype: torch.dtype | None,
    d: int = D,
) -> list[tuple[torch.Tensor, torch.Tensor, CacheTensors, CacheTensors]]:
    layout = make_layout(kv_heads, page_dtype, d)
    reqs = make_requests(SHAPE)
    caches = [filled_cache(layout, reqs) for _ in range(2)]
    steps = [
        build_step(reqs, layout, caches[0].kv_pages, {}, kernels=kernels),
        build_step(reqs, layout, caches[1].kv_pages, {}, kernels=None),
    ]
    assert isinstance(steps[0].ctx.attn_meta[0], KernelAttnMeta)
    assert isinstance(steps[1].ctx.attn_meta[0], AttnMeta)
    gen = torch.Generator().manual_seed(5)
    tokens = sum(n for _, n in SHAPE)
    qkv = tuple(
        torch.randn(tokens, h, 2 * d, generator=gen).to(act_dtype)
        for h in (heads, kv_heads, kv_heads)
    )
    sinks = torch.randn(heads, generator=gen) if with_sinks else None
    results = []
    for layer_id in (0, 1):
        native, ref = (
            run_layer(layer_id, s, heads, kv_heads, qkv, softcap, sinks, compute_dtype)
            for s in steps
        )
        results.append((native, ref, caches[0], caches[1]))
    return results


@pytest.mark.parametrize("heads,kv_heads", [(2, 2), (4, 2), (8, 2)])
@pytest.mark.parametrize("softcap", [None, 5.0])
@pytest.mark.parametrize("with_sinks", [False, True])
@pytest.mark.parametrize("page_dtype", ["float32", "bfloat16"])
def test_kernels_match_the_torch_path_exactly_in_float32(
    kernels: AttentionKernels,
    heads: int,
    kv_heads: int,
    softcap: float | None,
    with_sinks: bool,
    page_dtype: str,
) -> None:
    """float32 arithmetic on both paths (bfloat16 pages are read as float32 by both)."""
    for native, ref, cache_n, cache_r in both_paths(
        kernels, page_dtype, heads, kv_heads, softcap, with_sinks, torch.float32, torch.float32
    ):
        assert torch.isfinite(native).all()
        assert (native - ref).abs().max().item() < 1e-5
        for layer_id, pages in cache_n.kv_pages.items():  # identical writes, NaN kept
            assert torch.equal(pages.nan_to_num(7.0), cache_r.kv_pages[layer_id].nan_to_num(7.0))


@pytest.mark.parametrize("page_dtype", ["float32", "bfloat16"])
def test_head_sizes_off_the_vector_width_match_too(
    kernels: AttentionKernels, page_dtype: str
) -> None:
    """Head sizes 12 and 24 (not multiples of 16): the kernels' scalar loops."""
    for native, ref, _, _ in both_paths(
        kernels, page_dtype, 8, 2, 5.0, True, torch.float32, torch.float32, d=12
    ):
        assert (native - ref).abs().max().item() < 1e-5


@pytest.mark.parametrize("page_dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("softcap", [None, 5.0])
def test_head_sizes_64_and_128_match_too(
    kernels: AttentionKernels, page_dtype: str, softcap: float | None
) -> None:
    """Head sizes 64 and 128: the decode path's loops built for those sizes."""
    for native, ref, _, _ in both_paths(
        kernels, page_dtype, 12, 4, softcap, True, torch.float32, torch.float32, d=64
    ):
        assert (native - ref).abs().max().item() < 1e-5


@pytest.mark.parametrize("softcap", [None, 5.0])
def test_bfloat16_model_is_close_to_the_torch_path(
    kernels: AttentionKernels, softcap: float | None
) -> None:
    """A bfloat16 model attending natively: torch in bfloat16, the kernels in float32."""
    for native, ref, _, _ in both_paths(
        kernels, "bfloat16", 4, 2, softcap, False, torch.bfloat16, None
    ):
        assert native.dtype == torch.bfloat16
        assert (native.float() - ref.float()).abs().max().item() < 3e-2


def test_bad_tables_are_refused(kernels: AttentionKernels) -> None:
    table = torch.tensor([[1, 2]])
    rows, pos = torch.tensor([0]), torch.tensor([7])
    assert KernelTable.checked(table, rows, pos, None, B, NUM_BLOCKS).window == 0
    with pytest.raises(IndexError, match="block id"):
        KernelTable.checked(torch.tensor([[1, NUM_BLOCKS]]), rows, pos, None, B, NUM_BLOCKS)
    with pytest.raises(IndexError, match="position"):
        KernelTable.checked(table, rows, torch.tensor([8]), None, B, NUM_BLOCKS)
    with pytest.raises(IndexError, match="row"):
        KernelTable.checked(table, torch.tensor([1]), pos, None, B, NUM_BLOCKS)
    meta = KernelTable.checked(table, rows, pos, None, B, NUM_BLOCKS)
    pages = torch.zeros(NUM_BLOCKS, 2, B, 2, D)
    kv = torch.zeros(1, 2, D)
    with pytest.raises(ValueError, match="q"):
        kernels.forward(torch.zeros(2, 4, D), kv, kv, pages, meta, 1.0)
    with pytest.raises(ValueError, match="k/v"):
        kernels.forward(torch.zeros(1, 4, D), kv, torch.zeros(1, 1, D), pages, meta, 1.0)
    with pytest.raises(ValueError, match="heads"):
        kernels.forward(torch.zeros(1, 3, D), kv, kv, pages, meta, 1.0)
    with pytest.raises(ValueError, match="sinks"):
        kernels.forward(torch.zeros(1, 4, D), kv, kv, pages, meta, 1.0, None, torch.zeros(3))
    with pytest.raises(ValueError, match="pages"):
        kernels.forward(torch.zeros(1, 4, D), kv, kv, pages.half(), meta, 1.0)
    assert torch.equal(pages, torch.zeros_like(pages))  # nothing written


def test_page_layouts_are_checked_for_every_new_shape_and_stride(
    kernels: AttentionKernels,
) -> None:
    """Layouts are remembered once checked: pages of the same shape but other strides or
    dtype are still refused, after good pages of that shape were used."""
    meta = KernelTable.checked(
        torch.tensor([[1, 2]]), torch.tensor([0]), torch.tensor([7]), None, B, NUM_BLOCKS
    )
    q, kv = torch.randn(1, 4, D), torch.randn(1, 2, D)
    good = torch.zeros(NUM_BLOCKS, 2, B, 2, D)
    assert kernels.forward(q, kv, kv, good, meta, 1.0).shape == (1, 4, D)
    strided = torch.zeros(NUM_BLOCKS, 2, B, D, 2).transpose(3, 4)  # same shape, kv heads apart
    assert strided.shape == good.shape
    with pytest.raises(ValueError, match="contiguous"):
        kernels.forward(q, kv, kv, strided, meta, 1.0)
    with pytest.raises(ValueError, match="pages"):
        kernels.forward(q, kv, kv, good.half(), meta, 1.0)
    assert torch.equal(strided, torch.zeros_like(strided))  # nothing written


def test_without_kernels_the_step_takes_the_torch_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    assert_unavailable_without_compiler(
        native_attention.load_attention.__wrapped__,
        "native paged attention unavailable",
        tmp_path,
        monkeypatch,
        caplog,
    )
    monkeypatch.setattr(step_builder, "load_attention", lambda: None)
    layout = make_layout(2, "float32")
    reqs = make_requests(SHAPE)
    step = build_step(reqs, layout, CacheTensors(layout, NUM_BLOCKS, 0).kv_pages, {})
    assert isinstance(step.ctx.attn_meta[0], AttnMeta)


@pytest.mark.parametrize("page_dtype", [torch.float32, torch.bfloat16])
def test_outputs_do_not_depend_on_the_thread_count(
    kernels: AttentionKernels, page_dtype: torch.dtype
) -> None:
    """A step big enough to be split over threads (decodes of uneven depths and a prompt
    chunk): every work item is summed by one thread, so 1 and 2 threads give the same bits."""
    gen = torch.Generator().manual_seed(6)
    contexts, chunk, blocks_each = [3, 40, 97, 150, 7, 120], 37, 10
    table = torch.arange(1, 1 + 7 * blocks_each).view(7, blocks_each)
    rows = torch.tensor(list(range(6)) + [6] * chunk)
    positions = torch.tensor(contexts + list(range(chunk)))
    meta = KernelTable.checked(table, rows, positions, None, 16, 7 * blocks_each + 1)
    pages = torch.randn(7 * blocks_each + 1, 2, 16, 4, 64, generator=gen).to(page_dtype)
    qkv = torch.randn(len(rows), 12 + 4 + 4, 64, generator=gen)
    outs = []
    before = torch.get_num_threads()
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            q, k, v = qkv[:, :12], qkv[:, 12:16], qkv[:, 16:]
            outs.append(kernels.forward(q, k, v, pages.clone(), meta, 0.125))
    finally:
        torch.set_num_threads(before)
    assert torch.equal(outs[0], outs[1])
