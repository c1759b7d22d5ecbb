"""The native libraries' cache key covers every file a kernel source includes: a kernel split
over a ``.c`` file and headers of ``hybridkv/native`` is rebuilt when any of its pieces
changes (no compiler needed)."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

import hybridkv.native as native
from hybridkv.native.isa import resolve_isa

NATIVE = Path(native.__file__).parent
LOCAL_INCLUDE = re.compile(r'^#include "([^"]+)"', re.MULTILINE)


def _local_includes(path: Path) -> set[str]:
    """Every ``#include "..."`` reached from ``path``, transitively."""
    found: set[str] = set()
    todo = [path]
    while todo:
        for name in LOCAL_INCLUDE.findall(todo.pop().read_text()):
            if name not in found:
                found.add(name)
                todo.append(NATIVE / name)
    return found


@pytest.mark.parametrize("source", sorted(p.name for p in NATIVE.glob("*.c")))
def test_local_includes_are_headers_of_the_directory(source: str) -> None:
    for name in _local_includes(NATIVE / source):
        assert "/" not in name and name.endswith(".h"), name
        assert (NATIVE / name).is_file(), name


@pytest.mark.parametrize(
    ("source", "header"),
    [("attention.c", "attention_decode.h"), ("ssm_prefill.c", "ssm_scan.h")],
)
def test_key_changes_with_an_included_header(source: str, header: str, tmp_path: Path) -> None:
    assert header in _local_includes(NATIVE / source)
    for path in NATIVE.glob("*.[ch]"):
        shutil.copy(path, tmp_path / path.name)
    before = native._library_path("cc", resolve_isa(), tmp_path / source)
    with open(tmp_path / header, "a") as f:
        f.write("/* changed */\n")
    assert native._library_path("cc", resolve_isa(), tmp_path / source) != before
