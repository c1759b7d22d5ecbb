"""What every benchmark shares: the machine it ran on, the checkpoint it builds."""

from __future__ import annotations

import os
import platform
from pathlib import Path
from typing import Any


def machine_info(**extra: Any) -> dict[str, Any]:
    """Cores, Python, platform, torch version and threads (when torch imports), thread env."""
    info: dict[str, Any] = {
        "cores": os.cpu_count(),
        "affinity_cores": len(os.sched_getaffinity(0))
        if hasattr(os, "sched_getaffinity")
        else None,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
    }
    try:
        import torch

        info["torch"] = torch.__version__
        info["threads"] = torch.get_num_threads()
    except ImportError:  # pragma: no cover - the vLLM baseline venv has its own torch
        info["torch"] = None
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        if var in os.environ:
            info[var] = os.environ[var]
    return {**info, **extra}


SIMD_FLAGS = ("avx2", "fma", "avx512f", "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16")


def cpu_flags() -> list[str]:
    """The CPU's SIMD flags that decide GEMM and attention speed (from /proc/cpuinfo)."""
    try:
        with open("/proc/cpuinfo") as f:
            line = next((x for x in f if x.startswith("flags")), "")
    except OSError:
        return []
    present = set(line.split(":", 1)[-1].split())
    return [flag for flag in SIMD_FLAGS if flag in present]


def ensure_checkpoint(cache_dir: Path, arch: str, size: str) -> Path:
    """The checkpoint ``cache_dir/arch-size``, built (atomically) by ``make_model`` if missing."""
    from hybridkv.model.loading.make_model import ensure_model

    ensure_model(arch, cache_dir / f"{arch}-{size}", size=size, seed=0)
    return cache_dir / f"{arch}-{size}"
