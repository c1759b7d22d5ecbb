"""The native page-copy kernels: copies land on the right pages and nowhere else, their
checksums equal the plain checksum of the host bytes, and the checksum notices a changed,
moved or missing byte. Bad shapes and block ids are refused before any byte is touched."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from hybridkv import native as native_module
from hybridkv.native import PageCopy, PageTable
from tests.native.no_compiler import assert_unavailable_without_compiler

G, PAGE, NUM_BLOCKS = 3, 256, 10


def make_pages(seed: int = 0) -> tuple[list[torch.Tensor], PageTable]:
    gen = torch.Generator().manual_seed(seed)
    backing = [torch.randint(0, 256, (NUM_BLOCKS, PAGE), dtype=torch.uint8, generator=gen)]
    backing += [torch.randint(0, 256, (NUM_BLOCKS, PAGE), dtype=torch.uint8) for _ in range(G - 1)]
    bases = np.array([b.data_ptr() for b in backing], dtype=np.uint64)
    return backing, PageTable(bases, PAGE, NUM_BLOCKS, tuple(backing))


def host_bytes(rows: int, seed: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (rows, G, PAGE), dtype=np.uint8)


def test_gather_copies_the_pages_and_checksums_what_it_wrote(native: PageCopy) -> None:
    backing, pages = make_pages()
    blocks = np.array([7, 2, 9], dtype=np.int64)
    out = np.zeros((3, G, PAGE), dtype=np.uint8)
    digest = native.gather(out, pages, blocks)
    for r, b in enumerate(blocks):
        for g in range(G):
            assert np.array_equal(out[r, g], backing[g][b].numpy())
    assert digest == native.hash(out)


def test_scatter_writes_only_rows_with_a_block_and_checksums_every_row(native: PageCopy) -> None:
    backing, pages = make_pages()
    before = [b.clone() for b in backing]
    data = host_bytes(3)
    blocks = np.array([4, -1, 0], dtype=np.int64)  # row 1: checksummed, not written
    assert native.scatter(data, pages, blocks) == native.hash(data)
    for g in range(G):
        assert np.array_equal(backing[g][4].numpy(), data[0, g])
        assert np.array_equal(backing[g][0].numpy(), data[2, g])
        untouched = [b for b in range(NUM_BLOCKS) if b not in (0, 4)]
        assert torch.equal(backing[g][untouched], before[g][untouched])


def test_the_checksum_does_not_depend_on_how_the_bytes_are_split(native: PageCopy) -> None:
    _, pages = make_pages()
    data = host_bytes(4)
    whole = native.scatter(data, pages, np.full(4, -1, dtype=np.int64))
    assert whole == native.hash(data) == native.hash(data.reshape(-1).copy())


def test_every_single_byte_change_is_noticed(native: PageCopy) -> None:
    data = host_bytes(2).reshape(-1)
    reference = native.hash(data)
    for offset in range(0, data.size, 37):
        for bit in (0, 7):
            data[offset] ^= 1 << bit
            assert native.hash(data) != reference, (offset, bit)
            data[offset] ^= 1 << bit
    assert native.hash(data) == reference


def test_moved_stripes_and_lengths_change_the_checksum(native: PageCopy) -> None:
    data = host_bytes(1).reshape(-1)
    swapped = data.copy()
    swapped[:32], swapped[64:96] = data[64:96], data[:32]
    assert native.hash(swapped) != native.hash(data)
    zeros = np.zeros(100, dtype=np.uint8)
    digests = {native.hash(zeros[:n]) for n in range(0, 100)}  # zero padding never collides
    assert len(digests) == 100
    assert native.hash(data[:33]) != native.hash(data[:32])


def test_bad_shapes_and_block_ids_are_refused_before_copying(native: PageCopy) -> None:
    backing, pages = make_pages()
    before = [b.clone() for b in backing]
    data = host_bytes(2)
    with pytest.raises(IndexError, match="out of range"):
        native.scatter(data, pages, np.array([1, NUM_BLOCKS], dtype=np.int64))
    with pytest.raises(IndexError, match="out of range"):
        native.gather(np.empty_like(data), pages, np.array([-1, 0], dtype=np.int64))
    with pytest.raises(ValueError, match="expected uint8"):
        native.scatter(data[:, :2].copy(), pages, np.array([1, 2], dtype=np.int64))
    with pytest.raises(ValueError, match="int64"):
        native.scatter(data, pages, np.array([1, 2], dtype=np.int32))
    with pytest.raises(ValueError, match="contiguous"):
        native.hash(data[:, 0])
    assert all(torch.equal(a, b) for a, b in zip(backing, before, strict=True))


def test_the_library_is_built_once_and_reused(
    native: PageCopy, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HYBRIDKV_CACHE_DIR", str(tmp_path))
    kernel = native_module.load_pagecopy.__wrapped__()
    assert kernel is not None
    built = list((tmp_path / "native").glob("pagecopy-*.so"))
    assert len(built) == 1 and not list((tmp_path / "native").glob("*.tmp"))
    stamp = built[0].stat().st_mtime_ns
    assert native_module.load_pagecopy.__wrapped__() is not None
    assert built[0].stat().st_mtime_ns == stamp  # loaded, not rebuilt
    data = host_bytes(1)
    assert kernel.hash(data) == native.hash(data)


def test_without_a_compiler_the_kernels_are_none_and_say_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    assert_unavailable_without_compiler(
        native_module.load_pagecopy.__wrapped__,
        "native page copy unavailable",
        tmp_path,
        monkeypatch,
        caplog,
    )


def test_the_device_cache_gives_its_pages_when_kernels_can_walk_them() -> None:
    from hybridkv.engine.cache_access import DeviceCacheAccess
    from tests.connectors.helpers import make_layout

    layout = make_layout("full")
    backing = [torch.zeros(6, 64, dtype=torch.uint8) for _ in range(2)]
    pages = DeviceCacheAccess(layout, backing, {}).page_table()
    assert pages is not None and (pages.num_blocks, pages.page_bytes, pages.num_groups) == (
        6,
        64,
        2,
    )
    assert [int(a) for a in pages.bases] == [b.data_ptr() for b in backing]
    odd = [torch.zeros(6, 48, dtype=torch.uint8) for _ in range(2)]  # not whole stripes
    assert DeviceCacheAccess(layout, odd, {}).page_table() is None
    strided = [torch.zeros(6, 128, dtype=torch.uint8)[:, :64] for _ in range(2)]
    assert DeviceCacheAccess(layout, strided, {}).page_table() is None
