"""The one reader of secret files (API key, NIXL and remote-tier keys): its rules."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from hybridkv.secret_file import MAX_SECRET_BYTES, check_secret, read_secret_file


def _file(path: Path, data: bytes, mode: int = 0o600) -> Path:
    path.write_bytes(data)
    path.chmod(mode)
    return path


def test_a_private_file_gives_its_stripped_secret(tmp_path: Path) -> None:
    path = _file(tmp_path / "k", b"  s3cret-value \n")
    assert read_secret_file(path, "--x") == b"s3cret-value"
    assert read_secret_file(_file(tmp_path / "g", b"abc", 0o640), "--x") == b"abc"  # group ok
    link = tmp_path / "link"
    link.symlink_to(path)  # mounted secrets are symlinks
    assert read_secret_file(link, "--x") == b"s3cret-value"


@pytest.mark.parametrize(
    ("data", "mode", "match"),
    [
        (b"abc", 0o644, "--x: .* readable by others \\(mode 644\\); chmod 600 it"),
        (b" \n", 0o600, "--x: .* is empty"),
        (b"x" * (MAX_SECRET_BYTES + 10), 0o600, f"holds {MAX_SECRET_BYTES + 1} bytes"),
        (b"short", 0o600, "holds 5 bytes; it needs 16 to"),
    ],
)
def test_a_bad_file_is_refused_naming_the_option(
    tmp_path: Path, data: bytes, mode: int, match: str
) -> None:
    path = _file(tmp_path / "k", data, mode)
    with pytest.raises(ValueError, match=match) as err:
        read_secret_file(path, "--x", min_bytes=16 if data == b"short" else 1)
    assert "abc" not in str(err.value).replace(str(path), "")  # the secret is never said


def test_what_is_not_a_regular_file_is_refused_without_blocking(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="--x: .* is not a regular file"):
        read_secret_file(tmp_path, "--x")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo, 0o600)  # no writer: a blocking open would hang here
    with pytest.raises(ValueError, match="is not a regular file"):
        read_secret_file(fifo, "--x")
    with pytest.raises(ValueError, match="--x: cannot read .*missing"):
        read_secret_file(tmp_path / "missing", "--x")


def test_an_environment_value_follows_the_same_length_rule() -> None:
    assert check_secret(b" v \n", "$ENV", "--x") == b"v"
    with pytest.raises(ValueError, match="--x: \\$ENV holds 3 bytes; it needs 16"):
        check_secret(b"abc", "$ENV", "--x", min_bytes=16)
