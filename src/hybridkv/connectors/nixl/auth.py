"""The deployment key of the NixlConnector: one secret shared by the prefill and decode engines
of one deployment, used for two things only.

- **Transfer params.** A producer signs what it hands out (``sign_params``: request id, engine
  id, host, port, block ids and starts, state entries, block size, num_tokens, lease, expiry,
  and a digest of the prompt tokens ``[0, num_tokens)`` whose KV they name); a consumer loads
  only params whose HMAC verifies against its own request's prompt (``verify_params``). A
  client can hand params it was given to a decode engine (before they expire) but cannot
  change one byte of them nor use them with another prompt: no other user's blocks, no forged
  lease, no other producer, no KV cached under a prompt it was not computed for.
- **The side channel's handshake** (``side_channel``): challenge-response MACs both ways, so a
  party without the key gets no agent metadata and cannot pose as a producer.

Contract of ``load_auth_key(path, single_host)``:

1. ``path`` given (``kv_connector_extra_config.auth_key_file``): its content, stripped, is
   the key (at least ``MIN_KEY_LEN`` characters); a file others can read is logged as a risk.
2. Else ``$HYBRIDKV_KV_AUTH_KEY`` (same rule).
3. Else, only in a single-host setup (every host this engine serves or trusts is loopback):
   the key in ``<cache dir>/nixl_auth_key``, generated once (32 random bytes, hex) with mode
   0600 and created atomically, so every engine of this user on this host shares it; its path
   is logged once per process. A multi-host setup without a key is refused at start-up.

The key never leaves the process (no log, no error message, no descriptor carries it). Cost:
HMAC-SHA256 over a few hundred bytes, ~1-3 µs per request on each side.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import os
import secrets
from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from hybridkv.paths import cache_dir
from hybridkv.sampling.transfer_params import TransferFields
from hybridkv.secret_file import check_secret, read_secret_file

log = logging.getLogger(__name__)

ENV = "HYBRIDKV_KV_AUTH_KEY"
KEY_FILE = "nixl_auth_key"
MIN_KEY_LEN = 16
PARAMS_TAG = "hybridkv-nixl-params-v1"  # domain separation from the handshake's MACs
_logged: set[str] = set()  # generated key paths already logged by this process


@dataclass(frozen=True, slots=True)
class AuthKey:
    key: bytes
    source: str  # where it came from, for messages ("auth_key_file /x", "HYBRIDKV_KV_AUTH_KEY")

    def __repr__(self) -> str:  # never the secret
        return f"AuthKey(source={self.source!r})"

    def mac(self, *parts: bytes) -> bytes:
        """HMAC-SHA256 over ``parts`` (each length-prefixed, so no two splits collide)."""
        h = hmac.new(self.key, digestmod=hashlib.sha256)
        for part in parts:
            h.update(len(part).to_bytes(4, "big"))
            h.update(part)
        return h.digest()

    def check(self, tag: bytes, *parts: bytes) -> bool:
        return hmac.compare_digest(tag, self.mac(*parts))


def _canonical(f: TransferFields) -> bytes:
    fields = [f.request_id, f.engine_id, f.host, f.port, f.block_ids, f.block_starts, f.state,
              f.block_size, f.num_tokens, f.lease, f.expires_ms, f.prompt_digest]  # fmt: skip
    return json.dumps(fields, separators=(",", ":")).encode()


def prompt_digest(token_ids: Sequence[int]) -> str:
    """The hex digest (``remote_prompt_digest``) of the prompt tokens whose KV params name
    (``[0, num_tokens)``): a consumer loads only into a request with those tokens."""
    return hashlib.blake2b(array("q", token_ids).tobytes(), digest_size=16).hexdigest()


def sign_params(key: AuthKey, fields: TransferFields) -> str:
    """The producer's signature (hex, ``remote_signature``) of ``fields``."""
    return key.mac(PARAMS_TAG.encode(), _canonical(fields)).hex()


def verify_params(key: AuthKey, fields: TransferFields) -> bool:
    """Whether ``fields.signature`` is this deployment's signature of the other fields."""
    if fields.signature is None:
        return False
    try:
        tag = bytes.fromhex(fields.signature)
    except ValueError:
        return False
    return key.check(tag, PARAMS_TAG.encode(), _canonical(fields))


def load_auth_key(path: str | None, single_host: bool) -> AuthKey:
    """The deployment key (see the module's contract); raises ValueError naming the option."""
    if path:
        key = read_secret_file(path, "NixlConnector: auth_key_file", MIN_KEY_LEN)
        return AuthKey(key, f"auth_key_file {path}")
    env = os.environ.get(ENV)
    if env is not None:
        return AuthKey(check_secret(env.encode(), ENV, "NixlConnector: the key", MIN_KEY_LEN), ENV)
    if not single_host:
        raise ValueError(
            "NixlConnector: engines on several hosts need a shared key: set "
            f"kv_connector_extra_config.auth_key_file (or {ENV}) to the same secret on every "
            "prefill and decode engine"
        )
    try:
        return _generated(cache_dir() / KEY_FILE)
    except OSError as exc:
        raise ValueError(f"NixlConnector: cannot create the single-host key in {cache_dir()} "
                         f"({exc}); set auth_key_file or {ENV}") from None  # fmt: skip


def _generated(path: Path) -> AuthKey:
    """The single-host key at ``path``, created once (atomically: written to a private file,
    then linked in place, so a second engine starting at the same time reads the whole key)."""
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{KEY_FILE}.{os.getpid()}.{secrets.token_hex(4)}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_hex(32) + "\n")
        try:
            os.link(tmp, path)
        except FileExistsError:
            pass  # another engine made it first: use theirs
        finally:
            tmp.unlink()
    if path.stat().st_mode & 0o077:
        raise ValueError(f"NixlConnector: the generated key {path} is readable by other users; "
                         "chmod 600 it or set auth_key_file")  # fmt: skip
    key = AuthKey(
        read_secret_file(path, "NixlConnector: the generated key", MIN_KEY_LEN), f"generated {path}"
    )
    if str(path) not in _logged:
        _logged.add(str(path))
        log.warning("NixlConnector: no auth_key_file or %s given; engines on this host share "
                    "the key at %s (copy it to auth_key_file to add engines on other hosts)",
                    ENV, path)  # fmt: skip
    return key
