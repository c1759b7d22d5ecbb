"""Who may use the remote tier's server, and where its key comes from (issue 26, finding 6):
a ``valkey-server --requirepass`` with the right password (file or environment) works; a
wrong or missing one is an error naming the option at start-up, and one that changes while
the engine runs is counted and logged, never silent. The deployment key is read from a file
or the environment, else generated once per host (0600); a key file others can read, or a
short one, is refused. Passwords never go in the URL; TLS options need a TLS URL."""

from __future__ import annotations

import logging
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from hybridkv.connectors.offloading.tiers.remote import key as remote_key
from hybridkv.connectors.offloading.tiers.remote.connect import ENV_PASSWORD
from hybridkv.connectors.offloading.tiers.remote.key import ENV_KEY, GENERATED_FILE, load_remote_key
from hybridkv.connectors.registry import parse_kv_transfer_config
from tests.connectors.helpers import make_layout
from tests.support.tls_proxy import make_certificate, tls_front
from tests.support.valkey_server import ValkeyProcess, running_valkey

from .helpers import OffloadEngine, offload_config
from .test_remote_tier import load, settle, store

PASSWORD = "s3cret pass"


@pytest.fixture
def key_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_KEY, "the deployment key of these tests")
    monkeypatch.delenv(ENV_PASSWORD, raising=False)


@pytest.fixture
def server(tmp_path: Path, key_env: None) -> Iterator[ValkeyProcess]:
    with running_valkey(tmp_path / "valkey", password=PASSWORD) as proc:
        yield proc


def secret_file(path: Path, text: str, mode: int = 0o600) -> str:
    path.write_text(text)
    path.chmod(mode)
    return str(path)


def engine(server: ValkeyProcess, seed: int, **extra: object) -> OffloadEngine:
    config = offload_config(cpu=None, remote=server.url, remote_timeout_seconds=2, **extra)
    return OffloadEngine(config, make_layout("hybrid"), seed=seed)


def parse(**extra: object) -> None:
    parse_kv_transfer_config(offload_config(cpu="1MiB", **extra), 4)


# -- ACL / AUTH against a real server ---------------------------------------------------------


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_the_right_password_from_a_file_or_the_environment_works(
    server: ValkeyProcess, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    a = engine(server, seed=1, remote_password_file=secret_file(tmp_path / "pw", PASSWORD + "\n"))
    req = store(a)
    assert a.counters()["stores.remote"] == 2
    monkeypatch.setenv(ENV_PASSWORD, PASSWORD)
    b = engine(server, seed=2, remote_username="default")
    assert settle(b, req) == (16, True)
    assert load(b, req, 16)["invalid"] == 0
    b.assert_clean()


@pytest.mark.slow
@pytest.mark.timeout(60)
@pytest.mark.parametrize("password", [None, "wrong"])
def test_a_wrong_or_missing_password_stops_the_start(
    server: ValkeyProcess, tmp_path: Path, password: str | None
) -> None:
    extra = (
        {} if password is None else {"remote_password_file": secret_file(tmp_path / "pw", password)}
    )
    with pytest.raises(ValueError, match="'remote_password_file'.*refused the credentials"):
        engine(server, seed=1, **extra)


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_a_password_changed_under_a_running_engine_is_counted_and_logged(
    server: ValkeyProcess, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    a = engine(server, seed=1, remote_password_file=secret_file(tmp_path / "pw", PASSWORD))
    client = server.client()
    client.config_set("requirepass", "rotated")
    client.client_kill_filter(_type="normal", skipme=True)  # the engine's connections
    with caplog.at_level(logging.WARNING, "hybridkv.connectors.offloading"):
        store(a)
    counters = a.counters()
    assert counters["store_failures.remote"] >= 1
    assert counters["remote_errors:AuthenticationError"] >= 1
    assert any("AuthenticationError" in r.getMessage() for r in caplog.records)
    a.assert_clean()


def test_an_unreachable_server_at_start_is_a_warning_not_an_error(
    key_env: None, caplog: pytest.LogCaptureFixture
) -> None:
    config = offload_config(cpu=None, remote="valkey://127.0.0.1:1/0", remote_timeout_seconds=0.2)
    with caplog.at_level(logging.WARNING, "hybridkv.connectors.offloading"):
        OffloadEngine(config, make_layout("hybrid"))
    assert any("does not answer yet" in r.getMessage() for r in caplog.records)


# -- options ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "url",
    ["valkey://:pw@127.0.0.1:6379/0", "redis://user:pw@host:6379", "valkey://h:1/0?password=x"],
)
def test_a_password_in_the_url_is_refused(url: str) -> None:
    with pytest.raises(ValueError, match="'remote_url'.*password.*remote_password_file"):
        parse(remote=url)


def test_tls_options_need_a_tls_url_and_access_options_need_a_url(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="'remote_tls_ca_file'.*TLS remote_url"):
        parse(remote="valkey://h:1/0", remote_tls_ca_file=str(tmp_path))
    with pytest.raises(ValueError, match="'remote_username'.*only used with remote_url"):
        parse(remote_username="kv")
    with pytest.raises(ValueError, match="'remote_password_file'.*non-empty string"):
        parse(remote="valkey://h:1/0", remote_password_file="")
    parse(remote="valkeys://h:1/0", remote_tls_ca_file="ca.pem")  # valid (checked at start)


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_tls_with_a_password_stores_and_loads(server: ValkeyProcess, tmp_path: Path) -> None:
    """Through a TLS front (the bundled server has no TLS build): the tier's own reply reader
    reads the TLS socket; a certificate the CA file does not vouch for stops the start."""
    cert, key = make_certificate(tmp_path, "server")
    wrong_ca, _ = make_certificate(tmp_path, "other")
    pw = secret_file(tmp_path / "pw", PASSWORD)
    with tls_front(server.port, cert, key) as front:
        url = f"valkeys://127.0.0.1:{front.port}/0"
        a = OffloadEngine(
            offload_config(cpu=None, remote=url, remote_tls_ca_file=str(cert),
                           remote_password_file=pw, remote_timeout_seconds=2),
            make_layout("hybrid"), seed=1,
        )  # fmt: skip
        req = store(a)
        assert a.counters()["stores.remote"] == 2
        b = engine(server, seed=2, remote_password_file=pw)  # plain TCP, same values
        assert settle(b, req) == (16, True)
        assert load(b, req, 16)["invalid"] == 0
        config = offload_config(
            cpu=None, remote=url, remote_tls_ca_file=str(wrong_ca), remote_password_file=pw
        )
        with pytest.raises(ValueError, match="'remote_tls_ca_file'.*TLS handshake.*failed"):
            OffloadEngine(config, make_layout("hybrid"))
        a.assert_clean()
        b.assert_clean()


def test_tls_files_reach_the_client_and_must_exist(key_env: None, tmp_path: Path) -> None:
    import valkey

    from hybridkv.connectors.offloading.config import OffloadingConfig
    from hybridkv.connectors.offloading.tiers.remote.connect import create_pool

    ca = secret_file(tmp_path / "ca.pem", "-----BEGIN CERTIFICATE-----\n", 0o644)
    options = parse_kv_transfer_config(
        offload_config(cpu=None, remote="valkeys://10.0.0.5:6380/0", remote_tls_ca_file=ca), 4
    ).options_as(OffloadingConfig)
    pool = create_pool(options, None)
    assert pool.connection_class is valkey.SSLConnection
    assert pool.connection_kwargs["ssl_ca_certs"] == ca
    assert pool.connection_kwargs["host"] == "10.0.0.5"
    missing = parse_kv_transfer_config(
        offload_config(cpu=None, remote="rediss://h:1", remote_tls_cert_file="/nonexistent"), 4
    ).options_as(OffloadingConfig)
    with pytest.raises(ValueError, match="'remote_tls_cert_file'.*not a readable file"):
        create_pool(missing, None)


# -- the deployment key ------------------------------------------------------------------------


def test_the_key_is_generated_once_per_host_private(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.delenv(ENV_KEY, raising=False)
    monkeypatch.setenv("HYBRIDKV_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(remote_key, "_logged", set())
    with caplog.at_level(logging.INFO, "hybridkv.connectors.offloading"):
        first, second = load_remote_key(None), load_remote_key(None)
    path = tmp_path / "cache" / GENERATED_FILE
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600 and path.stat().st_size == 32
    assert first.keyed_name("x") == second.keyed_name("x")  # one key for the host
    assert sum("generated once" in r.getMessage() for r in caplog.records) == 1


def test_a_key_from_a_file_or_the_environment_is_the_same_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ENV_KEY, "  0123456789abcdef0123456789abcdef\n")
    path = secret_file(tmp_path / "k", "0123456789abcdef0123456789abcdef")
    assert load_remote_key(None).keyed_name("x") == load_remote_key(path).keyed_name("x")
    assert load_remote_key(None).keyed_name("x") != load_remote_key(None).keyed_name("y")


@pytest.mark.parametrize(
    ("text", "mode", "match"),
    [
        ("0123456789abcdef0123", 0o644, "readable by others"),
        ("short", 0o600, "holds 5 bytes"),
        ("x" * 5000, 0o600, "holds 4097 bytes"),
    ],
)
def test_a_bad_key_file_is_refused_naming_the_option(
    tmp_path: Path, text: str, mode: int, match: str
) -> None:
    path = secret_file(tmp_path / "k", text, mode)
    with pytest.raises(ValueError, match=f"'remote_auth_key_file'.*{match}"):
        load_remote_key(path)
    with pytest.raises(ValueError, match="'remote_auth_key_file'.*cannot read"):
        load_remote_key(str(tmp_path / "missing"))


def test_a_short_key_in_the_environment_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_KEY, "short")
    with pytest.raises(ValueError, match=f"'remote_auth_key_file'.*{ENV_KEY} holds 5 bytes"):
        load_remote_key(None)
