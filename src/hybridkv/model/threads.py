"""How many compute threads a step runs on: torch's GEMMs and the native kernels share one
OpenMP pool, sized per step here.

Measured (docs/benchmarks.md, issue 17, ``benchmarks/thread_phases.py``, qwen3_full-small, 16
requests): a decode step makes ~100 parallel regions of 0.1-1 ms each; with two threads on a
shared 2-core machine (load 12-19) decode took 6-8x the wall time and CPU time of one thread
(OpenMP's barriers spin while the other thread is descheduled), and the 2,048-token prefill
step 1.1-1.5x. Decode regions are too short to pay for a second thread's barriers even on a
quiet machine, where a prefill step's large GEMMs still should. vLLM's CPU worker computes on
one bound thread. So by default
(``auto``) steps of fewer than ``SMALL_STEP_TOKENS`` tokens (decode) run on one thread and
larger ones (prefill chunks) on the pool size the process had when the engine started
(``OMP_NUM_THREADS`` / ``torch.set_num_threads``); ``HYBRIDKV_COMPUTE_THREADS=N`` pins every
step to N threads.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

SMALL_STEP_TOKENS = 256  # below: one thread (a GEMM of < 256 rows is < ~2 ms here)
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
    """Thread count per step: ``fixed`` for every step, else one for small steps and ``most``
    for large ones."""

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

    def for_tokens(self, tokens: int) -> int:
        if self.fixed is not None:
            return self.fixed
        return 1 if tokens < SMALL_STEP_TOKENS else self.most

    def use_for(self, tokens: int) -> None:
        """Size the pool for a step of ``tokens`` tokens (a no-op when it already is)."""
        n = self.for_tokens(tokens)
        if n != self.current or n != torch.get_num_threads():
            pool = process_pool()
            torch.set_num_threads(n)
            _last.count, _last.pool = n, pool
            self.current = n
