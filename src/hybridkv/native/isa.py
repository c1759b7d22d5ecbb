"""The instruction-set variants the native kernels are built for.

``native`` (the default) builds for the machine at hand (``-march=native``). The others pin an
instruction set so that one machine can build, run and test the code paths another machine
kind would take: an AVX-512 CI machine still checks the AVX2 path.

- ``avx512``: x86-64-v4 (AVX-512 F/BW/CD/DQ/VL, FMA), generic tuning;
- ``avx2``: x86-64-v3 (AVX2 + FMA) tuned for AMD Zen 3, the AVX2-only machines this project
  meets. Tuning changes code generation, not only speed: GCC's Zen tuning avoids fusing some
  multiply-add chains into FMAs, which once made one skinny-GEMM path round differently from
  another (issue 25);
- ``scalar``: the x86-64 baseline (SSE2, no AVX, no FMA), what a CPU without AVX runs.

``HYBRIDKV_NATIVE_ISA`` picks one for the whole process; a name this CPU cannot run is refused
with the CPU flags it lacks (running it would die on an illegal instruction).
"""

from __future__ import annotations

import functools
import os
import platform
from dataclasses import dataclass

ISA_ENV = "HYBRIDKV_NATIVE_ISA"
_V3 = frozenset({"avx", "avx2", "bmi1", "bmi2", "f16c", "fma", "abm", "movbe", "xsave"})


@dataclass(frozen=True, slots=True)
class IsaVariant:
    """One build of the kernels: compiler flags, and the ``/proc/cpuinfo`` flags it needs."""

    name: str
    flags: tuple[str, ...]
    needs: frozenset[str]
    x86_only: bool = True


VARIANTS: dict[str, IsaVariant] = {
    v.name: v
    for v in (
        IsaVariant("native", ("-march=native",), frozenset(), x86_only=False),
        IsaVariant(
            "avx512",
            ("-march=x86-64-v4", "-mtune=generic"),
            _V3 | {"avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"},
        ),
        IsaVariant("avx2", ("-march=x86-64-v3", "-mtune=znver3"), _V3),
        IsaVariant("scalar", ("-march=x86-64", "-mtune=generic"), frozenset()),
    )
}


@functools.cache
def cpu_flags() -> frozenset[str]:
    """This CPU's flags (``/proc/cpuinfo``, read once per process: every kernel's build key and
    every variant check asks); empty where that file is not there."""
    try:
        with open("/proc/cpuinfo") as f:
            line = next((line for line in f if line.startswith("flags")), "")
    except OSError:
        return frozenset()
    return frozenset(line.partition(":")[2].split())


def missing_flags(variant: IsaVariant) -> list[str]:
    """What this machine lacks to run ``variant`` (``["x86_64"]`` off x86): [] if it can."""
    if variant.x86_only and platform.machine() not in ("x86_64", "AMD64"):
        return ["x86_64"]
    return sorted(variant.needs - cpu_flags())


def runnable_isas() -> list[str]:
    """The variants this machine can build and run, ``native`` first."""
    return [name for name, v in VARIANTS.items() if not missing_flags(v)]


def resolve_isa(name: str | None = None) -> IsaVariant:
    """The variant named (``None``: ``$HYBRIDKV_NATIVE_ISA``, default ``native``); a
    ``ValueError`` naming the choices for an unknown name, or the missing CPU flags."""
    chosen = (os.environ.get(ISA_ENV) or "native") if name is None else name
    variant = VARIANTS.get(chosen)
    if variant is None:
        raise ValueError(f"{ISA_ENV}={chosen!r} is not one of {', '.join(VARIANTS)}")
    missing = missing_flags(variant)
    if missing:
        raise ValueError(
            f"{ISA_ENV}={chosen!r}: this CPU lacks {', '.join(missing)}; it can run "
            f"{', '.join(runnable_isas())}"
        )
    return variant
