"""Paged attention kernels (``attention.c``): K/V read in place from the pages, no gather.

``load_attention()`` builds the C source like the page-copy kernels (``hybridkv.native``) and
returns None where that is impossible or ``HYBRIDKV_NATIVE=0``; attention then runs on the
pure-torch path (``model/layers/attention.py``), which is also the kernels' test reference.

One step's metadata (``KernelTable``) is checked once when built — every table entry a block
of the pages, every position inside its row's table — so each layer's call only checks the
tensors' shapes and dtypes.
"""

from __future__ import annotations

import ctypes
import functools
from dataclasses import dataclass
from pathlib import Path

import torch

from hybridkv.native import load_library

SOURCE = Path(__file__).with_name("attention.c")
PAGE_DTYPES = {torch.float32: 0, torch.bfloat16: 1}


class _Shape(ctypes.Structure):
    _fields_ = [
        ("num_tokens", ctypes.c_int64),
        ("num_heads", ctypes.c_int64),
        ("num_kv_heads", ctypes.c_int64),
        ("head_dim", ctypes.c_int64),
        ("block_size", ctypes.c_int64),
        ("block_stride", ctypes.c_int64),
        ("table_stride", ctypes.c_int64),
        ("window", ctypes.c_int64),
        ("bf16", ctypes.c_int64),
        ("q_stride", ctypes.c_int64),
        ("k_stride", ctypes.c_int64),
        ("v_stride", ctypes.c_int64),
        ("scale", ctypes.c_float),
        ("softcap", ctypes.c_float),
    ]


@dataclass(frozen=True, slots=True)
class KernelTable:
    """Where every token of a step reads and writes K/V, for one attention group."""

    block_table: torch.Tensor  # [R, nb] int64, contiguous: each request's blocks
    rows: torch.Tensor  # [T] int64: the table row of each token
    positions: torch.Tensor  # [T] int64: each token's position (its K/V slot)
    window: int  # sliding window in tokens; 0: none

    @classmethod
    def checked(
        cls,
        block_table: torch.Tensor,
        rows: torch.Tensor,
        positions: torch.Tensor,
        window: int | None,
        block_size: int,
        num_blocks: int,
    ) -> KernelTable:
        """The table, refused unless every read and write it leads to is inside the pages."""
        if block_table.dtype != torch.int64 or block_table.dim() != 2:
            raise ValueError(f"block table must be int64 [R, nb], got {block_table.dtype}")
        if rows.shape != positions.shape or rows.dim() != 1:
            raise ValueError("rows and positions must be [T] each")
        table, rows, positions = (x.contiguous() for x in (block_table, rows, positions))
        ids, row_ids, pos = (x.numpy() for x in (table, rows, positions))  # cheaper checks
        if ids.size and (int(ids.min()) < 0 or int(ids.max()) >= num_blocks):
            raise IndexError(f"block id out of range [0, {num_blocks})")
        if row_ids.size:
            if int(row_ids.min()) < 0 or int(row_ids.max()) >= table.shape[0]:
                raise IndexError("token row outside the block table")
            if int(pos.min()) < 0 or int(pos.max()) >= table.shape[1] * block_size:
                raise IndexError("token position past its block table")
        return cls(table, rows, positions, window or 0)


@dataclass(frozen=True, slots=True)
class _PageLayout:
    """One layer's pages ``[N, 2, B, kv_heads, d]``, checked once per shape and stride."""

    block_size: int
    num_kv_heads: int
    head_dim: int
    block_stride: int
    bf16: int


class AttentionKernels:
    """The C kernels with the checks that keep them inside their buffers."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        ptr = ctypes.c_void_p
        self._attn = lib.hk_attn
        self._attn.argtypes = [ctypes.POINTER(_Shape), *[ptr] * 9]
        self._attn.restype = ctypes.c_int
        self._layouts: dict[tuple[object, ...], _PageLayout] = {}

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        pages: torch.Tensor,
        meta: KernelTable,
        scale: float,
        softcap: float | None = None,
        sinks: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Write ``k``/``v`` ``[T, kv_heads, d]`` into their slots of ``pages``
        (``[N, 2, B, kv_heads, d]``), then attend: ``q`` ``[T, heads, d]`` -> float32
        ``[T, heads, d]``. ``sinks`` ``[heads]``: one extra logit per head (gpt-oss)."""
        page = self._layout(pages)
        tokens, kv_heads, dim = meta.rows.shape[0], page.num_kv_heads, page.head_dim
        q32, k32, v32 = _float32(q, "q"), _float32(k, "k"), _float32(v, "v")
        heads = q32.shape[1]
        if q32.shape[0] != tokens or q32.shape[2] != dim:
            raise ValueError(f"q {tuple(q.shape)} does not fit the pages or the step")
        if k32.shape != (tokens, kv_heads, dim) or v32.shape != k32.shape:
            raise ValueError(f"k/v {tuple(k.shape)}/{tuple(v.shape)} do not fit the pages")
        if heads % kv_heads:
            raise ValueError(f"{heads} heads over {kv_heads} kv heads")
        sink32 = None if sinks is None else _float32(sinks, "sinks")
        if sink32 is not None and sink32.shape != (heads,):
            raise ValueError(f"sinks {tuple(sink32.shape)} (expected [{heads}])")
        shape = _Shape(
            tokens, heads, kv_heads, dim, page.block_size, page.block_stride,
            meta.block_table.shape[1], meta.window, page.bf16,
            q32.stride(0), k32.stride(0), v32.stride(0), scale, softcap or 0.0,
        )  # fmt: skip
        out = torch.empty((tokens, heads, dim), dtype=torch.float32)
        failed = self._attn(
            ctypes.byref(shape),
            q32.data_ptr(),
            k32.data_ptr(),
            v32.data_ptr(),
            out.data_ptr(),
            pages.data_ptr(),
            meta.block_table.data_ptr(),
            meta.rows.data_ptr(),
            meta.positions.data_ptr(),
            None if sink32 is None else sink32.data_ptr(),
        )
        if failed:
            raise MemoryError("paged attention: no memory for its score buffers")
        return out

    def _layout(self, pages: torch.Tensor) -> _PageLayout:
        """``pages``' layout, checked the first time its dtype, shape and strides are seen."""
        key = (pages.dtype, pages.shape, pages.stride())
        layout = self._layouts.get(key)
        if layout is None:
            if pages.dtype not in PAGE_DTYPES or pages.dim() != 5 or pages.shape[1] != 2:
                raise ValueError(
                    f"pages must be float32/bfloat16 [N, 2, B, kv, d], got {pages.dtype}"
                )
            _, _, block, kv_heads, dim = pages.shape
            if pages.stride()[1:] != (block * kv_heads * dim, kv_heads * dim, dim, 1):
                raise ValueError("each page must be one contiguous [2, B, kv, d] run")
            layout = _PageLayout(block, kv_heads, dim, pages.stride(0), PAGE_DTYPES[pages.dtype])
            self._layouts[key] = layout
        return layout


def _float32(x: torch.Tensor, name: str) -> torch.Tensor:
    """``x`` as float32 whose rows (last dim) and heads (dim 1) are packed: views into the
    step's fused q/k/v projection pass as they are (their token stride goes to the kernel)."""
    if x.dtype != torch.float32:
        if not x.dtype.is_floating_point:
            raise ValueError(f"{name} must be floating point, got {x.dtype}")
        x = x.to(torch.float32)
    if x.dim() == 3 and x.stride(2) == 1 and x.stride(1) == x.shape[2] and x.stride(0) >= 0:
        return x
    return x.contiguous()


@functools.cache
def load_attention(isa: str | None = None) -> AttentionKernels | None:
    """The paged attention kernels, built on first use; None (logged once) if they cannot be."""
    lib = load_library(SOURCE, "paged attention", "attending with torch", isa)
    return None if lib is None else AttentionKernels(lib)
