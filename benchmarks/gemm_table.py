"""CPU time of a run's GEMMs by weight format, path and activation rows (``mixed_profile.py
--gemms``): every ``QuantGemm.linear`` (native kernel, int8 or float32 activations), every
``linear_by_panels`` (dequantized panels + ``F.linear``) and every other ``F.linear`` (float32
weights), timed on the calling thread's clock. The compiled decode program's kernels run
inside one native call and are not seen here (``step_profile.py``'s "forward" has them)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch

ROW_BUCKETS = (1, 8, 16, 32, 48, 64, 128, 256, 512, 1024, 2048, 1 << 30)


def bucket(rows: int) -> str:
    """``lo-hi`` of the bucket holding ``rows``."""
    lo = 1
    for hi in ROW_BUCKETS:
        if rows <= hi:
            return f"{lo}-{hi}" if hi < 1 << 30 else f"{lo}+"
        lo = hi + 1
    raise AssertionError(rows)


class GemmTable:
    """(label, row bucket) -> [calls, seconds]; nested GEMMs count once (the outer one)."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock
        self.cells: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0, 0.0])
        self.depth = 0

    def timed(self, fn: Callable[..., Any], label: Callable[..., str]) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if self.depth:
                return fn(*args, **kwargs)
            self.depth += 1
            began = self.clock()
            try:
                return fn(*args, **kwargs)
            finally:
                self.depth -= 1
                key = label(*args, **kwargs)
                cell = self.cells[key]
                cell[0] += 1
                cell[1] += self.clock() - began

        return wrapper

    def rows(self) -> list[dict[str, Any]]:
        """One dict per cell, largest seconds first."""
        out = [
            {"gemm": k[0], "rows": k[1], "calls": int(v[0]), "s": v[1]}
            for k, v in self.cells.items()
        ]
        return sorted(out, key=lambda r: -r["s"])


def _rows(x: torch.Tensor) -> int:
    return x.numel() // max(x.shape[-1], 1)


def _kernel_label(_self: Any, x: torch.Tensor, _d: Any, fmt: Any, *a: Any, **kw: Any) -> tuple:
    int8 = kw.get("int8_activations", a[1] if len(a) > 1 else False)
    return (f"{fmt.name} {'int8' if int8 else 'float'} kernel", bucket(_rows(x)))


def _panel_label(x: torch.Tensor, _d: Any, fmt: Any, *a: Any, **kw: Any) -> tuple:
    return (f"{fmt.name} panels", bucket(_rows(x)))


def _float_label(x: torch.Tensor, *a: Any, **kw: Any) -> tuple:
    return ("f32 F.linear", bucket(_rows(x)))


@contextmanager
def gemms_timed(table: GemmTable) -> Iterator[None]:
    """Time every GEMM entry point into ``table`` while inside."""
    from hybridkv.model.layers import quant_linear as ql
    from hybridkv.native.quant import QuantGemm

    saved = [(QuantGemm, "linear"), (ql, "linear_by_panels"), (torch.nn.functional, "linear")]
    originals = [getattr(o, a) for o, a in saved]
    labels = (_kernel_label, _panel_label, _float_label)
    for (owner, attr), fn, label in zip(saved, originals, labels, strict=True):
        setattr(owner, attr, table.timed(fn, label))
    try:
        yield
    finally:
        for (owner, attr), fn in zip(saved, originals, strict=True):
            setattr(owner, attr, fn)
