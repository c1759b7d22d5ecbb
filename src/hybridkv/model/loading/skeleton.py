"""A model's skeleton: its modules built on the meta device with no initialiser run.

Every weight comes from the checkpoint, so drawing random ones is wasted work, and on the meta
device ``nn.Embedding``'s ``normal_`` goes through torch's reference implementations, whose
first use imports ``torch._dynamo`` and sympy: 1.3 s of CPU at every engine start. The mode is
thread-local (a torch function mode), so nothing outside the ``with`` block is affected."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch.overrides import TorchFunctionMode


class _SkipInit(TorchFunctionMode):
    """``torch.nn.init.*`` returns its tensor untouched; everything else runs as usual."""

    def __torch_function__(
        self,
        func: Callable[..., Any],
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        if getattr(func, "__module__", None) == "torch.nn.init":
            return args[0] if args else kwargs["tensor"]  # init functions pass it by name
        return func(*args, **kwargs)


@contextmanager
def skeleton() -> Iterator[None]:
    """Build modules inside: parameters on the meta device, no initialiser run."""
    with torch.device("meta"), _SkipInit():
        yield
