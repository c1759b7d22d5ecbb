"""The part file format: what a reader accepts and how it names what it rejects."""

from __future__ import annotations

import os
import struct
from pathlib import Path

import pytest

from hybridkv.connectors.file.format import (
    PartError,
    encode_header,
    parse_part,
    read_part,
    write_part,
)

PAYLOAD = bytes(range(256)) * 4


def written(tmp_path: Path) -> Path:
    path = tmp_path / "part.kv"
    assert write_part(str(path), "fp", "g0/ab.kv", (4, 8), PAYLOAD) == len(PAYLOAD)
    return path


def reason(
    path: Path,
    fp: str = "fp",
    key: str = "g0/ab.kv",
    span: tuple[int, int] = (4, 8),
    size: int = len(PAYLOAD),
) -> str:
    with pytest.raises(PartError) as info:
        read_part(str(path), fp, key, span, size)
    return info.value.reason


def test_round_trip(tmp_path: Path) -> None:
    path = written(tmp_path)
    assert bytes(read_part(str(path), "fp", "g0/ab.kv", (4, 8), len(PAYLOAD))) == PAYLOAD
    assert [p.name for p in tmp_path.iterdir()] == ["part.kv"]  # no temporary left


def test_every_check_has_a_reason(tmp_path: Path) -> None:
    path = written(tmp_path)
    data = path.read_bytes()
    assert reason(tmp_path / "nope.kv") == "missing"
    assert reason(path, fp="other") == "mismatch"
    assert reason(path, key="g1/ab.kv") == "mismatch"
    assert reason(path, span=(0, 4)) == "mismatch"
    assert reason(path, size=len(PAYLOAD) - 1) == "mismatch"
    path.write_bytes(data + b"x")
    assert reason(path) == "corrupt"
    path.write_bytes(data[:40])
    assert reason(path) == "truncated"
    path.write_bytes(data[:-1])
    assert reason(path) == "truncated"
    path.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
    assert reason(path) == "corrupt"
    path.write_bytes(data[:4] + struct.pack("<H", 99) + data[6:])
    assert reason(path) == "mismatch"  # a future format version


def test_failed_write_keeps_the_previous_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = written(tmp_path)

    def failing_replace(src: str, dst: str) -> None:
        assert Path(src).parent == tmp_path and Path(src).name.endswith(".tmp")
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", failing_replace)
    with pytest.raises(OSError, match="disk full"):
        write_part(str(path), "fp", "g0/ab.kv", (4, 8), b"new bytes")
    with pytest.raises(OSError, match="disk full"):
        write_part(str(tmp_path / "fresh.kv"), "fp", "g0/cd.kv", (4, 8), b"new bytes")
    monkeypatch.undo()
    assert bytes(read_part(str(path), "fp", "g0/ab.kv", (4, 8), len(PAYLOAD))) == PAYLOAD
    assert [p.name for p in tmp_path.iterdir()] == ["part.kv"]  # no temporary, no fresh.kv


def test_a_part_held_in_memory_is_checked_like_a_file(tmp_path: Path) -> None:
    """Header and payload as separate values (the remote tier's layout), the payload in one
    piece or several: checked like a file, each kind of damage named."""
    data = written(tmp_path).read_bytes()  # the file's bytes == header + payload in memory
    head = encode_header("fp", "g0/ab.kv", (4, 8), memoryview(PAYLOAD), "sha256")
    assert data == head + PAYLOAD
    one = parse_part(head, [PAYLOAD], "fp", "g0/ab.kv", (4, 8), 1024)
    assert one is PAYLOAD  # one piece: returned as it is, no copy
    pieces = [PAYLOAD[:100], memoryview(PAYLOAD)[100:700], PAYLOAD[700:]]
    assert bytes(parse_part(head, pieces, "fp", "g0/ab.kv", (4, 8), 1024)) == PAYLOAD
    xhead = encode_header("fp", "g0/ab.kv", (4, 8), memoryview(PAYLOAD), "xxh3")
    assert bytes(parse_part(xhead, pieces, "fp", "g0/ab.kv", (4, 8), 1024)) == PAYLOAD

    def why(h: bytes, payload: list[bytes], key: str = "g0/ab.kv") -> str:
        with pytest.raises(PartError) as info:
            parse_part(h, payload, "fp", key, (4, 8), len(PAYLOAD))
        return info.value.reason

    flipped = bytearray(PAYLOAD)
    flipped[-3] ^= 1
    assert why(head, [bytes(flipped)]) == "corrupt"
    assert why(xhead, [PAYLOAD[:500], bytes(flipped)[500:]]) == "corrupt"
    assert why(head, [PAYLOAD[:-1]]) == "truncated"
    assert why(head, [PAYLOAD, b"x"]) == "corrupt"
    assert why(head, [PAYLOAD], key="g1/ab.kv") == "mismatch"
    assert why(head[:10], [PAYLOAD]) == "truncated"
    assert why(head + b"x", [PAYLOAD]) == "corrupt"
