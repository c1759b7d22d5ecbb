"""Connecting to the remote tier's server: credentials, TLS, and the check at start-up.

::

    remote_url            valkey://host:port/db, redis://..., unix://path, or valkeys:// /
                          rediss:// for TLS (never a password: it would show in ``ps``)
    remote_username       an ACL user (default: the URL's, else ``default``)
    remote_password_file  the password, read once at start-up; else $HYBRIDKV_REMOTE_PASSWORD
    remote_tls_ca_file    CA bundle that verifies the server (TLS URLs only)
    remote_tls_cert_file  client certificate (with ``remote_tls_key_file``) for mutual TLS

``check_server`` PINGs once at start-up: credentials the server refuses, or a TLS handshake
that fails (an unverified certificate), are a ``ValueError`` naming the option (the engine
does not start); a server that cannot be reached is logged as a warning and the tier starts
anyway (its commands fail fast and are counted until it answers).
"""

from __future__ import annotations

import logging
import os
import ssl
from typing import Any

import valkey

from hybridkv.connectors.offloading.config import OffloadingConfig
from hybridkv.secret_file import read_secret_file

log = logging.getLogger("hybridkv.connectors.offloading")

ENV_PASSWORD = "HYBRIDKV_REMOTE_PASSWORD"
MAX_PASSWORD_BYTES = 4096
NUM_CONNECTIONS = 8


def create_pool(options: OffloadingConfig, command_packer: Any) -> valkey.BlockingConnectionPool:
    """The tier's bounded connection pool: every command and connect bounded by
    ``remote_timeout_seconds``, authenticated and encrypted as the options say."""
    assert options.remote_url is not None
    url = options.remote_url
    if url.startswith("valkey://"):
        url = "redis://" + url[len("valkey://") :]
    timeout = options.remote_timeout_seconds
    kwargs: dict[str, Any] = dict(
        max_connections=NUM_CONNECTIONS,
        timeout=timeout,
        socket_timeout=timeout,
        socket_connect_timeout=timeout,
        command_packer=command_packer,
        lib_name=None,  # no ``CLIENT SETINFO`` round trips on each (re)connection
        lib_version=None,
    )
    kwargs.update(_credentials(options))
    kwargs.update(_tls(options))
    pool: valkey.BlockingConnectionPool = valkey.BlockingConnectionPool.from_url(  # type: ignore[no-untyped-call]
        url, **kwargs
    )
    return pool


def check_server(client: valkey.Valkey, options: OffloadingConfig) -> None:
    """One PING: refused credentials are a ``ValueError`` naming the option; an unreachable
    server a warning (the tier retries by itself)."""
    try:
        client.ping()
    except valkey.AuthenticationError as exc:
        raise ValueError(
            f"OffloadingConnector: 'remote_password_file': the server at "
            f"{_where(options)} refused the credentials ({exc}); check remote_username, "
            f"remote_password_file or ${ENV_PASSWORD}"
        ) from None
    except valkey.ResponseError as exc:  # e.g. NOPERM: an ACL user without PING
        raise ValueError(
            f"OffloadingConnector: 'remote_username': the server at {_where(options)} "
            f"refused a PING ({exc})"
        ) from None
    except (valkey.ConnectionError, valkey.TimeoutError) as exc:
        if isinstance(exc.__context__, ssl.SSLError):  # e.g. a certificate not verified
            raise ValueError(
                f"OffloadingConnector: 'remote_tls_ca_file': the TLS handshake with "
                f"{_where(options)} failed ({exc})"
            ) from None
        log.warning(
            "remote tier: the server at %s does not answer yet (%s); its lookups miss and its "
            "stores are dropped (counted in remote_errors) until it does",
            _where(options),
            exc,
        )


def _credentials(options: OffloadingConfig) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if options.remote_username is not None:
        out["username"] = options.remote_username
    if options.remote_password_file is not None:
        out["password"] = _password_file(options.remote_password_file)
    elif os.environ.get(ENV_PASSWORD):
        out["password"] = os.environ[ENV_PASSWORD]
    return out


def _password_file(path: str) -> str:
    secret = read_secret_file(path, "OffloadingConnector: 'remote_password_file'")
    try:
        return secret.decode()
    except UnicodeDecodeError:
        raise ValueError(
            f"OffloadingConnector: 'remote_password_file': {path} is not UTF-8 text"
        ) from None


def _tls(options: OffloadingConfig) -> dict[str, Any]:
    out: dict[str, Any] = {}
    files = {
        "ssl_ca_certs": ("remote_tls_ca_file", options.remote_tls_ca_file),
        "ssl_certfile": ("remote_tls_cert_file", options.remote_tls_cert_file),
        "ssl_keyfile": ("remote_tls_key_file", options.remote_tls_key_file),
    }
    for arg, (name, path) in files.items():
        if path is None:
            continue
        if not os.path.isfile(path):
            raise ValueError(f"OffloadingConnector: {name!r}: {path} is not a readable file")
        out[arg] = path
    return out


def _where(options: OffloadingConfig) -> str:
    """The URL without anything secret (passwords are refused in it anyway)."""
    url = options.remote_url or ""
    return url.split("@")[-1] if "@" in url else url
