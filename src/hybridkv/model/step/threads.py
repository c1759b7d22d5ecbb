"""How many compute threads a step runs on: torch's GEMMs and the native kernels share one
OpenMP pool, sized per step here.

Measured (``benchmarks/thread_phases.py``, qwen3_full-small, docs/benchmarks.md "Quiet
reruns"): on a quiet 2-core machine two threads make prefill 1.83x and decode 1.68x faster than
one (plain GEMMs); on a machine shared with other jobs (load 12-19) a decode step on two threads
took 6-8x the time of one thread (OpenMP's barriers spin while the other thread is
descheduled). The default (``auto``) is the quiet machine's best: every step on the pool size
the process had when the engine started (``OMP_NUM_THREADS`` / ``torch.set_num_threads``);
``HYBRIDKV_COMPUTE_THREADS=N`` pins every step to N threads (1 on a busy machine). The native
kernels (e.g. the decode GEMMs, ``native/gemm.c``) run on ``torch.get_num_threads()`` threads.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

ENV = "HYBRIDKV_COMPUTE_THREADS"


@dataclass(slots=True)
class _LastSet:
    """What a ``StepThreads`` last set the pool to, and the size it had been given before."""

    count: int = 0
    pool: int = 0


_last = _LastSet()


def process_pool() -> int:
    """The pool size the process asked for: torch's current one, unless that is a size some
    engine's step set (a finished engine's last decode step must not shrink the next one)."""
    n = torch.get_num_threads()
    return _last.pool if _last.count and n == _last.count else n


@dataclass(slots=True)
class StepThreads:
    """Thread count per step: ``fixed`` if pinned, else ``most`` (the process's pool)."""

    most: int
    fixed: int | None = None
    current: int = 0  # what this object last set (0: nothing yet)

    @classmethod
    def from_env(cls) -> StepThreads:
        """``auto`` (default) over the process's current pool, or ``$HYBRIDKV_COMPUTE_THREADS``."""
        value = os.environ.get(ENV, "auto").strip()
        if value == "auto":
            return cls(process_pool())
        if not value.isdigit() or int(value) < 1:
            raise ValueError(f"{ENV}={value!r}: expected auto or a positive integer")
        return cls(int(value), fixed=int(value))

    @property
    def count(self) -> int:
        return self.fixed if self.fixed is not None else self.most

    def use(self) -> None:
        """Size the pool for a step (a no-op when it already is)."""
        n = self.count
        if n != self.current or n != torch.get_num_threads():
            pool = process_pool()
            torch.set_num_threads(n)
            _last.count, _last.pool = n, pool
            self.current = n
