"""``ProgramBuilder``: emits a decode program's ops (``native/runner.c``) layer piece by layer
piece, each the kernel call the Python step makes for it, on buffers it allocates.

Every buffer is float32 ``[max_rows, width]``, rows contiguous; a step uses its first ``T``
rows. A piece the kernels cannot run exactly as the Python step does (a weight ``F.linear``
would multiply, a bfloat16 tensor, a norm the kernels do not have) raises ``Unsupported``
with the reason: the model then decodes in Python.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import nn

from hybridkv.model.layers import quant_linear
from hybridkv.model.layers.fused import FusedLinear
from hybridkv.model.layers.linear import Linear, ProjectionGemm
from hybridkv.model.layers.norm import OffsetRMSNorm, RMSNorm
from hybridkv.native.attention import PAGE_DTYPES
from hybridkv.native.rownorm import ACTIVATIONS
from hybridkv.native.runner import Op, OpKind


class Unsupported(Exception):
    """The planner cannot express this model's decode step; the message says why."""


@dataclass(frozen=True, slots=True)
class Rows:
    """Float32 rows of ``width`` at ``address`` (a buffer, or columns of one), ``stride``
    elements apart."""

    address: int
    width: int
    stride: int

    def at(self, start: int, width: int) -> Rows:
        """Columns ``[start, start + width)`` of these rows."""
        if start < 0 or start + width > self.width:
            raise ValueError(f"columns [{start}, {start + width}) of rows of {self.width}")
        return Rows(self.address + 4 * start, width, self.stride)


@dataclass(slots=True)
class ProgramBuilder:
    """The ops of one program and everything they point to (kept alive here).

    Buffers asked for inside layer ``i`` (``begin_layer``) come from pool ``i % 2``: layer
    ``i + 2`` reuses them (a layer's output is read by the next layer only), so a program
    holds two layers' worth of activations, warm in the caches; outside layers (the
    residual stream, the final hidden rows) each buffer is its own."""

    max_rows: int
    ops: list[Op] = field(default_factory=list)
    keep: list[torch.Tensor] = field(default_factory=list)
    _scope: int | None = None
    _pools: dict[tuple[int, int], list[Rows]] = field(default_factory=dict)
    _taken: dict[tuple[int, int], int] = field(default_factory=dict)

    def begin_layer(self, index: int | None) -> None:
        """Buffers from here on belong to layer ``index`` (None: to no layer)."""
        self._scope = None if index is None else index % 2
        self._taken = {}

    def buffer(self, width: int) -> Rows:
        """Float32 rows ``[max_rows, width]``: a pooled one inside a layer, else a new one."""
        if self._scope is None:
            return self._new_buffer(width)
        key = (self._scope, width)
        pool, taken = self._pools.setdefault(key, []), self._taken.get(key, 0)
        if taken == len(pool):
            pool.append(self._new_buffer(width))
        self._taken[key] = taken + 1
        return pool[taken]

    def _new_buffer(self, width: int) -> Rows:
        t = torch.zeros(self.max_rows, width, dtype=torch.float32)  # [R, width]
        self.keep.append(t)
        return Rows(t.data_ptr(), width, width)

    def emit(
        self,
        kind: OpKind,
        p: Sequence[int | None] = (),
        n: Sequence[int] = (),
        f: Sequence[float] = (),
    ) -> None:
        op = Op()
        op.kind = kind
        op.p[: len(p)] = list(p)
        op.n[: len(n)] = list(n)
        op.f[: len(f)] = list(f)
        self.ops.append(op)

    def pin(self, t: torch.Tensor, what: str) -> int:
        """``t``'s address (float32, contiguous), kept alive with the program."""
        if t.dtype != torch.float32 or not t.is_contiguous():
            raise Unsupported(f"{what} is {t.dtype}, not contiguous float32")
        self.keep.append(t)
        return t.data_ptr()

    def ops_array(self) -> ctypes.Array[Op]:
        return (Op * len(self.ops))(*self.ops)

    # -- pieces -------------------------------------------------------------------------

    def norm(
        self,
        norm: RMSNorm | OffsetRMSNorm,
        x: Rows,
        out: Rows,
        residual: Rows | None = None,
        x_scale: float = 1.0,
    ) -> Rows:
        """``norm(x)`` into ``out``; with ``residual``: ``residual += x * x_scale`` first and
        the sum normalised (``add_norm``)."""
        scale = self.pin(norm_scale(norm), "norm weight")
        for rows in (out, residual):
            if rows is not None and rows.stride != x.width:
                raise ValueError("norm out / residual rows must be contiguous")
        resid = None if residual is None else residual.address
        args = (x.address, resid, scale, out.address)
        eps = float(norm.eps)
        self.emit(OpKind.NORM, args, (1, x.width, x.stride, 1), (eps, x_scale))
        return out

    def linear(self, x: Rows, proj: Linear | FusedLinear, out: Rows | None = None) -> Rows:
        """``proj(x)``: one GEMM by its weight (a ``FusedLinear``'s concatenation when its parts
        share a format), else one per part into a scratch, copied into place (its ``cat``)."""
        parts = (proj,) if isinstance(proj, Linear) else proj.parts
        width = sum(p.out_features for p in parts)
        out = self.buffer(width) if out is None else out
        if isinstance(proj, Linear):
            self._gemm(x, proj.weight.detach(), proj.bias, proj.quant, out)
            return out
        if len({getattr(p, "quant", None) for p in parts}) == 1:
            weight, bias = proj.concatenated()
            self._gemm(x, weight, bias, getattr(parts[0], "quant", None), out)
            return out
        start = 0
        for part in parts:
            if not isinstance(part, Linear):
                raise Unsupported(f"a fused part {type(part).__name__}")
            scratch = self.buffer(part.out_features)
            self._gemm(x, part.weight.detach(), part.bias, part.quant, scratch)
            self.emit(OpKind.COPY, (scratch.address, out.address + 4 * start),
                      (part.out_features, scratch.stride, out.stride))  # fmt: skip
            start += part.out_features
        return out

    def _gemm(
        self,
        x: Rows,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        quant: object,
        out: Rows,
    ) -> None:
        n, k = int(weight.shape[0]), x.width
        if out.width != n or out.stride != n:
            raise ValueError(f"GEMM out of {out.width} for {n} outputs")
        b = None if bias is None else self.pin(bias.detach().float().contiguous(), "bias")
        self.keep.append(weight)
        if quant is None:
            check_skinny(weight, bias, k, self.max_rows)
            args = (x.address, weight.data_ptr(), b, out.address)
            self.emit(OpKind.GEMM, args, (x.stride, n, k, -1, 0))
            return
        path = quant_linear.choose_path(quant, self.max_rows)  # type: ignore[arg-type]
        if path is quant_linear.QuantPath.PANELS:  # read at planning, as ``quant_linear`` does
            raise Unsupported(f"{self.max_rows} rows of {quant} take the panel path")
        int8 = path is quant_linear.QuantPath.INT8_KERNEL
        ggml_type = quant.layout.ggml_type  # type: ignore[attr-defined]
        args = (x.address, weight.data_ptr(), b, out.address)
        self.emit(OpKind.GEMM, args, (x.stride, n, k, ggml_type, int(int8)))

    def act_mul(self, gate_up: Rows, kernel_act: str | None) -> Rows:
        """``act(gate) * up`` of ``[T, 2 * inner]`` rows -> new rows ``[T, inner]``."""
        if kernel_act not in ACTIVATIONS:
            raise Unsupported(f"activation {kernel_act!r} has no kernel")
        out = self.buffer(gate_up.width // 2)
        args = (gate_up.width // 2, gate_up.stride, ACTIVATIONS[kernel_act])
        self.emit(OpKind.ACT_MUL, (gate_up.address, out.address), args)
        return out


def norm_scale(norm: nn.Module) -> torch.Tensor:
    """What the norm's kernel call multiplies by: ``RMSNorm``'s weight, ``OffsetRMSNorm``'s
    ``1 + w`` (the same values ``_cached_scale`` holds)."""
    if isinstance(norm, OffsetRMSNorm):
        return norm.scale().contiguous()
    if isinstance(norm, RMSNorm):
        return norm.weight.detach()
    raise Unsupported(f"norm {type(norm).__name__} has no row kernel")


def check_skinny(weight: torch.Tensor, bias: torch.Tensor | None, k: int, max_rows: int) -> None:
    """Refuse a float32 projection the Python step would not put on the skinny kernel."""
    gemm = ProjectionGemm()
    x = torch.empty(max_rows, k, dtype=torch.float32)
    if gemm.kernel is None or not gemm.takes(x, weight, bias):
        raise Unsupported(f"a {weight.dtype} {tuple(weight.shape)} projection runs on F.linear")


def page_dtype_code(pages: torch.Tensor) -> int:
    if pages.dtype not in PAGE_DTYPES:
        raise Unsupported(f"{pages.dtype} KV pages")
    return PAGE_DTYPES[pages.dtype]
