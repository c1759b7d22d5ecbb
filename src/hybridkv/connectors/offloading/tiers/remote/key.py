"""The remote tier's deployment key: what authenticates values and names them on the server.

Every engine that shares a Valkey server must hold the same secret. It comes from the first
of these that is set:

1. ``remote_auth_key_file``: a file of at least ``MIN_SECRET_BYTES`` (e.g. written by
   ``openssl rand -hex 32``; surrounding whitespace is ignored), not readable by others;
2. the environment variable ``HYBRIDKV_REMOTE_AUTH_KEY`` (the same, as text);
3. ``<hybridkv cache dir>/remote-auth-key``: 32 random bytes generated once (0600,
   atomically), so the engines of one host share it without configuration.

The secret is stretched into a ``DirectoryKey`` (the disk tier's MACs, payload digest seed
and keyed names). Contract: a missing, short, world-readable or non-regular key file is a
``ValueError`` naming the option at start-up; the secret never leaves this process.
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading

from hybridkv.connectors.offloading.tiers.disk.key import DirectoryKey
from hybridkv.paths import cache_dir
from hybridkv.secret_file import check_secret, read_secret_file

log = logging.getLogger("hybridkv.connectors.offloading")

ENV_KEY = "HYBRIDKV_REMOTE_AUTH_KEY"
KEY_OPTION = "remote_auth_key_file"
GENERATED_FILE = "remote-auth-key"
MIN_SECRET_BYTES = 16
_logged: set[str] = set()  # key sources announced (once per process each)
_log_lock = threading.Lock()


def load_remote_key(key_file: str | None) -> DirectoryKey:
    """The deployment key (see the module docstring for the order); ``ValueError`` naming
    ``remote_auth_key_file`` if the file or the variable cannot be used."""
    if key_file is not None:
        secret = read_secret_file(key_file, _what(KEY_OPTION), MIN_SECRET_BYTES)
        source = f"{KEY_OPTION} {key_file}"
    elif os.environ.get(ENV_KEY):
        secret = check_secret(
            os.environ[ENV_KEY].encode(), ENV_KEY, _what(KEY_OPTION), MIN_SECRET_BYTES
        )
        source = ENV_KEY
    else:
        directory = cache_dir()
        try:
            directory.mkdir(parents=True, exist_ok=True, mode=0o700)
            generated = DirectoryKey.load_or_create(str(directory), GENERATED_FILE)
        except (OSError, ValueError) as exc:
            raise ValueError(
                _err(
                    KEY_OPTION,
                    f"not set, and no key can be generated in {directory} ({exc}); "
                    f"give {KEY_OPTION} or ${ENV_KEY}",
                )
            ) from None
        _log_once(
            str(directory / GENERATED_FILE),
            "remote tier: values are authenticated with the key in %s (generated once on this "
            "host); engines on other hosts sharing the server need the same key "
            "(remote_auth_key_file or %s)",
            directory / GENERATED_FILE,
            ENV_KEY,
        )
        return generated
    _log_once(source, "remote tier: values are authenticated with the key from %s", source)
    return DirectoryKey(_stretch(secret))


def _stretch(secret: bytes) -> bytes:
    """A 32-byte key from a secret of any accepted length."""
    return hashlib.blake2b(secret, digest_size=32, person=b"hkv-remote-key").digest()


def _log_once(source: str, message: str, *args: object) -> None:
    with _log_lock:
        if source in _logged:
            return
        _logged.add(source)
    log.info(message, *args)


def _what(option: str) -> str:
    return f"OffloadingConnector: {option!r}"


def _err(option: str, message: str) -> str:
    return f"{_what(option)}: {message}"
