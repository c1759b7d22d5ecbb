"""The deployment key's contract (``connectors/nixl/auth.py``): an explicit file, else the
environment, else on one host a key generated once (0600, atomically, shared by every engine of
the host); several hosts without a key, a short key, or a generated key others can read are
refused; the key never shows in a repr."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from hybridkv.connectors.nixl.auth import ENV, KEY_FILE, load_auth_key


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("HYBRIDKV_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv(ENV, raising=False)
    return tmp_path


def test_a_single_host_generates_one_private_key(cache: Path) -> None:
    first = load_auth_key(None, single_host=True)
    path = cache / KEY_FILE
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and len(first.key) == 64
    assert load_auth_key(None, single_host=True).key == first.key  # a second engine shares it
    assert first.key.decode() not in repr(first) and str(path) in first.source
    assert [p.name for p in cache.iterdir()] == [KEY_FILE]  # no temporary file left
    path.chmod(0o644)
    with pytest.raises(ValueError, match="readable by other users"):
        load_auth_key(None, single_host=True)


def test_the_file_then_the_environment_and_several_hosts_need_one(
    cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(ValueError, match="engines on several hosts need a shared key"):
        load_auth_key(None, single_host=False)
    monkeypatch.setenv(ENV, "an-environment-secret-1234")
    assert load_auth_key(None, single_host=False).key == b"an-environment-secret-1234"
    key_file = cache / "k"
    key_file.write_text("  a-file-secret-0123456789\n")
    key_file.chmod(0o600)
    assert load_auth_key(str(key_file), single_host=False).key == b"a-file-secret-0123456789"
    key_file.write_text("short")
    with pytest.raises(ValueError, match="auth_key_file: .* holds 5 bytes; it needs 16"):
        load_auth_key(str(key_file), single_host=True)
    key_file.write_text("a-file-secret-0123456789")
    key_file.chmod(0o604)  # was a warning; a key others can read is refused like the tiers'
    with pytest.raises(ValueError, match="auth_key_file: .* readable by others"):
        load_auth_key(str(key_file), single_host=True)
    with pytest.raises(ValueError, match="auth_key_file: cannot read"):
        load_auth_key(str(cache / "missing"), single_host=True)
    assert not (cache / KEY_FILE).exists()  # nothing generated when a key is given


@pytest.mark.parametrize("value", ["short", "   ", "x" * 5000])
def test_an_environment_key_out_of_bounds_is_refused_naming_the_variable(
    cache: Path, monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    monkeypatch.setenv(ENV, value)
    with pytest.raises(ValueError, match=f"NixlConnector: the key: {ENV} .* it needs 16 to"):
        load_auth_key(None, single_host=True)
