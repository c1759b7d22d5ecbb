"""A private ``$HYBRIDKV_CACHE_DIR`` for a test that must not see the user's cache (the
embedded default model built afresh, a key generated once), sharing only the compiled native
kernels: they are keyed by source and flags, and compiling them all again (about 11 s of CPU
on the AVX2 EPYC) would be most of such a test's time."""

from __future__ import annotations

from pathlib import Path

from hybridkv.paths import cache_dir


def private_cache(path: Path) -> Path:
    """``path`` created as a cache directory whose ``native/`` is the shared one's."""
    shared = cache_dir() / "native"
    shared.mkdir(parents=True, exist_ok=True)
    path.mkdir(parents=True)
    (path / "native").symlink_to(shared, target_is_directory=True)
    return path
