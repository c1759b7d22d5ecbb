"""A hostile disk-tier directory (issue 18): the stored parts under it replaced, in turn, by a
FIFO, a symlink to a file outside, a forged part, a part of another directory's key, a
truncated part, a huge sparse part, and a half-written part (a dead writer's ``.tmp``), plus
junk (FIFOs, a symlinked subdirectory). Used by the acceptance test and the B5 benchmark."""

from __future__ import annotations

import os
from pathlib import Path

from hybridkv.connectors.offloading.tiers.disk.format import tmp_owner

KINDS = ("fifo", "symlink", "forged", "foreign", "truncated", "huge", "half_written")
KEY_ID = slice(12, 20)  # disk_format v3: which directory key signed the part
DIGEST_BYTE = 50  # inside the MAC'd payload digest
HUGE = 5 << 30


def make_hostile(directory: Path, outside: Path) -> dict[str, int]:
    """Corrupt every stored part under ``directory`` (one kind each, in turn); ``outside`` is a
    file the symlinks point at, which nothing may touch. Returns how many of each kind."""
    planted = dict.fromkeys(KINDS, 0)
    parts = sorted(
        p
        for p in directory.rglob("*.kvu")
        if p.is_file() and not p.is_symlink() and p.stat().st_size < HUGE  # not planted yet
    )
    for n, part in enumerate(parts):
        kind = KINDS[n % len(KINDS)]
        _plant(part, kind, outside)
        planted[kind] += 1
    subdirs = sorted({p.parent for p in parts})
    for k, sub in enumerate(subdirs[:4]):
        for junk in (sub / f"junk{k}.kvu", sub / f".junk{k}.kvu.00000000-1.abcd.tmp"):
            if not os.path.lexists(junk):
                os.mkfifo(junk)
    if parts and not os.path.lexists(parts[0].parent.parent / "zz"):
        (parts[0].parent.parent / "zz").symlink_to(outside.parent, target_is_directory=True)
    return planted


def _plant(part: Path, kind: str, outside: Path) -> None:
    data = part.read_bytes()
    if kind in ("fifo", "symlink", "half_written"):
        part.unlink()
    if kind == "fifo":
        os.mkfifo(part)
    elif kind == "symlink":
        part.symlink_to(outside)
    elif kind == "half_written":  # a writer killed mid-write: its temporary file, no part
        owner = f"{tmp_owner().partition('-')[0]}-{2**22 + 7}"  # this host, a pid not in use
        (part.parent / f".{part.name}.{owner}.dead.tmp").write_bytes(data[:100])
    elif kind == "forged":  # bytes changed and no key to re-sign them
        part.write_bytes(
            data[:DIGEST_BYTE] + bytes([data[DIGEST_BYTE] ^ 1]) + data[DIGEST_BYTE + 1 :]
        )
    elif kind == "foreign":  # signed by another directory's key
        part.write_bytes(data[: KEY_ID.start] + b"\x01" * 8 + data[KEY_ID.stop :])
    elif kind == "truncated":
        part.write_bytes(data[: len(data) // 2])
    elif kind == "huge":  # a valid header, then gigabytes (sparse: free on disk)
        with open(part, "r+b") as f:
            f.truncate(HUGE)


def snapshot(path: Path) -> dict[str, tuple[int, float, bytes]]:
    """Size, mtime and bytes of every file under ``path`` (the outside must not change)."""
    return {
        str(p): (p.stat().st_size, p.stat().st_mtime, p.read_bytes())
        for p in sorted(path.rglob("*"))
        if p.is_file() and not p.is_symlink()
    }
