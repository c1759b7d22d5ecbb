"""Native kernels: copy KV pages and checksum them in one pass (``pagecopy.c``); paged
attention (``attention.c``, loaded by ``hybridkv.native.attention``). ``load_library`` builds
and loads either.

``load_pagecopy()`` compiles the C source with the system compiler on first use (``$CC`` or
``cc``, ``-O3`` and the instruction-set variant's flags, ``-march=native`` unless
``$HYBRIDKV_NATIVE_ISA`` pins another (``hybridkv.native.isa``), with ``-fopenmp`` when the compiler has it: the ``*_many``
calls then spread their copies over OpenMP threads, sharing torch's runtime) into
``$HYBRIDKV_CACHE_DIR/native`` (default ``~/.cache/hybridkv/native``), one library per source
version, variant, CPU and compiler, written under
a temporary name and renamed so concurrent processes never load a half-written file. It
returns None when that is impossible (no compiler, a failed build, ``HYBRIDKV_NATIVE=0``);
callers then keep their numpy + xxhash path. The choice is made once per process, so every
checksum a process compares was computed by the same function.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import platform
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from hybridkv.native.isa import IsaVariant, cpu_flags, resolve_isa
from hybridkv.paths import cache_dir

log = logging.getLogger(__name__)
SOURCE = Path(__file__).with_name("pagecopy.c")
FLAGS = [  # and the variant's (``isa.VARIANTS``)
    "-O3",
    "-shared",
    "-fPIC",
    "-std=c11",
    "-fno-strict-aliasing",
    "-ffp-contract=fast",  # fused multiply-adds (``-std=c11`` alone turns them off)
    # gcc may if-convert (so vectorize) loops with selects and divisions (sigmoid, softplus,
    # exp's clamp): no result changes (no reassociation), only which exception flags rise
    "-fno-trapping-math",
]
BUILD_TIMEOUT_S = 120.0
STRIPE = 32  # the kernels copy pages in 32-byte stripes: a page is a multiple of it


@dataclass(frozen=True, slots=True)
class PageTable:
    """The device cache's pages as addresses: page (block ``b``, layer slot ``g``) is the
    ``page_bytes`` at ``bases[g] + b * page_bytes``. ``owners`` keeps the memory alive."""

    bases: np.ndarray[Any, Any]  # [G] uint64 addresses of [num_blocks, page_bytes] tensors
    page_bytes: int
    num_blocks: int
    owners: tuple[Any, ...]

    @property
    def num_groups(self) -> int:
        return len(self.bases)


class PageCopy:
    """The kernels, with the shape and bounds checks that keep them inside their buffers."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        ptr, size = ctypes.c_void_p, ctypes.c_size_t
        self._hash = lib.hk_hash
        self._hash.argtypes = [ptr, size]
        self._hash.restype = ctypes.c_uint64
        self._gather, self._scatter = lib.hk_gather_many, lib.hk_scatter_many
        for fn in (self._gather, self._scatter):
            fn.argtypes = [ptr, ptr, ptr, size, ptr, size, size, ptr]
            fn.restype = None

    def hash(self, array: np.ndarray[Any, Any]) -> int:
        """The checksum of a C-contiguous array's bytes."""
        if not array.flags.c_contiguous:
            raise ValueError("hash needs a C-contiguous array")
        return int(self._hash(array.ctypes.data, array.nbytes))

    def gather(
        self, out: np.ndarray[Any, Any], pages: PageTable, blocks: np.ndarray[Any, Any]
    ) -> int:
        """``out[r, g] = page(blocks[r], g)``; the checksum of ``out`` (``[n, G, page]``)."""
        return self.gather_many([out], pages, [blocks])[0]

    def scatter(
        self, data: np.ndarray[Any, Any], pages: PageTable, blocks: np.ndarray[Any, Any]
    ) -> int:
        """``page(blocks[r], g) = data[r, g]`` (rows with ``blocks[r] < 0`` are skipped); the
        checksum of all of ``data``."""
        return self.scatter_many([data], pages, [blocks])[0]

    def gather_many(
        self, outs: list[np.ndarray[Any, Any]], pages: PageTable, blocks: list[Any]
    ) -> list[int]:
        """``gather`` of every ``(outs[i], blocks[i])``, in parallel; their checksums."""
        return self._call(self._gather, outs, pages, blocks, allow_skip=False)

    def scatter_many(
        self, datas: list[np.ndarray[Any, Any]], pages: PageTable, blocks: list[Any]
    ) -> list[int]:
        """``scatter`` of every ``(datas[i], blocks[i])``, in parallel; their checksums."""
        return self._call(self._scatter, datas, pages, blocks, allow_skip=True)

    @classmethod
    def _call(
        cls, fn: Any, hosts: list[Any], pages: PageTable, blocks: list[Any], allow_skip: bool
    ) -> list[int]:
        for host, ids in zip(hosts, blocks, strict=True):
            cls._check(host, pages, ids, allow_skip)

        def addresses(arrays: list[Any]) -> np.ndarray[Any, Any]:
            return np.array([a.ctypes.data for a in arrays], dtype=np.uint64)

        host_ptrs, block_ptrs = addresses(hosts), addresses(blocks)
        rows = np.array([len(b) for b in blocks], dtype=np.uint64)
        sums = np.zeros(len(hosts), dtype=np.uint64)
        fn(
            host_ptrs.ctypes.data,
            block_ptrs.ctypes.data,
            rows.ctypes.data,
            len(hosts),
            pages.bases.ctypes.data,
            pages.num_groups,
            pages.page_bytes,
            sums.ctypes.data,
        )
        return [int(x) for x in sums]

    @staticmethod
    def _check(host: Any, pages: PageTable, blocks: Any, allow_skip: bool) -> None:
        expected = (len(blocks), pages.num_groups, pages.page_bytes)
        if host.dtype != np.uint8 or host.shape != expected or not host.flags.c_contiguous:
            raise ValueError(f"host buffer {host.dtype}{host.shape}, expected uint8{expected}")
        if blocks.dtype != np.int64 or not blocks.flags.c_contiguous:
            raise ValueError("block ids must be a contiguous int64 array")
        if len(blocks) and (
            int(blocks.max()) >= pages.num_blocks or int(blocks.min()) < (-1 if allow_skip else 0)
        ):
            raise IndexError(f"block id out of range [0, {pages.num_blocks})")


def _cpu_signature() -> str:
    """What ``-march=native`` depends on: the machine and its CPU flags."""
    return f"{platform.machine()}|{' '.join(sorted(cpu_flags()))}"


def _flags(variant: IsaVariant) -> list[str]:
    return [*FLAGS, *variant.flags]


def _library_path(compiler: str, variant: IsaVariant, source: Path = SOURCE) -> Path:
    key = hashlib.sha256()
    headers = [h.read_bytes() for h in sorted(source.parent.glob("*.h"))]  # #included
    flags = " ".join(_flags(variant)).encode()
    for part in (source.read_bytes(), *headers, flags, compiler.encode()):
        key.update(part)
    key.update(_cpu_signature().encode())
    name = f"{source.stem}-{variant.name}-{key.hexdigest()[:16]}.so"
    return cache_dir() / "native" / name


def _build(compiler: str, variant: IsaVariant, target: Path, source: Path = SOURCE) -> None:
    """Build with OpenMP, else without it (the ``*_many`` calls then copy on one thread)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so.tmp", dir=target.parent)
    os.close(fd)
    try:
        for extra in (["-fopenmp"], []):
            cmd = [compiler, *_flags(variant), *extra, "-o", tmp, str(source), "-lm"]
            done = subprocess.run(cmd, capture_output=True, timeout=BUILD_TIMEOUT_S)
            if done.returncode == 0:
                os.replace(tmp, target)
                return
        raise subprocess.CalledProcessError(done.returncode, cmd, done.stdout, done.stderr)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def load_library(
    source: Path, name: str, fallback: str, isa: str | None = None
) -> ctypes.CDLL | None:
    """``source`` built for instruction-set variant ``isa`` (``None``: ``$HYBRIDKV_NATIVE_ISA``,
    default ``native``; once per source version, variant, CPU and compiler) and loaded; None
    (logged) when native code is off (``HYBRIDKV_NATIVE=0``) or cannot be built. A variant this
    CPU cannot run is a ``ValueError`` (``isa.resolve_isa``)."""
    if os.environ.get("HYBRIDKV_NATIVE", "1") == "0":
        return None
    variant = resolve_isa(isa)
    compiler = os.environ.get("CC", "cc")
    try:
        path = _library_path(compiler, variant, source)
        if not path.exists():
            _build(compiler, variant, path, source)
        return ctypes.CDLL(str(path))
    except (OSError, subprocess.SubprocessError) as err:
        detail = getattr(err, "stderr", b"") or b""
        log.warning("native %s unavailable (%s %s); %s", name, err, detail[:500], fallback)
        return None


@functools.cache
def load_pagecopy(isa: str | None = None) -> PageCopy | None:
    """The page copy kernels, built on first use; None (logged once) if they cannot be."""
    lib = load_library(SOURCE, "page copy", "using numpy", isa)
    return None if lib is None else PageCopy(lib)
