"""``kv_transfer_params`` (vLLM's P/D handshake fields), parsed once at the boundary.

A client hands these to a decode engine, copied from a prefill engine's answer: every field is
outside data. ``parse_transfer_params`` turns the known fields into typed, bounded values
(``TransferFields``; absent fields are None) or raises ``ValueError`` naming the field
(``kv_transfer_params.remote_port=...``), which the HTTP layer answers with a 400 and
``SamplingParams`` raises for the Python API. Unknown keys are ignored (other connectors' own
fields), but the whole object is bounded. Whether the values are *true* (signed by a producer
this engine trusts) is the connector's question (``connectors/nixl/auth.py``).

Imports nothing of hybridkv but the value checks, so ``params.py`` and the connectors
can both use it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from hybridkv.sampling.checks import is_int, short

MAX_KEYS = 64  # keys in one kv_transfer_params object
MAX_GROUPS = 64  # attention or state groups
MAX_BLOCKS = 1 << 20  # remote block ids over all groups
MAX_INDEX = (1 << 31) - 1  # block ids, table indices, staging entries, lease slots, tokens
MAX_GENERATION = 1 << 62  # lease generations
MAX_ID_LEN = 256  # engine and request ids
MAX_SIGNATURE_LEN = 128
MAX_EXPIRES_MS = 1 << 53  # epoch milliseconds
HOST_PATTERN = re.compile(r"[A-Za-z0-9._:\-\[\]]{1,255}")  # a name, IPv4 or IPv6 literal; no spaces
_HEX = re.compile(r"[0-9a-f]{16,128}")


@dataclass(frozen=True, slots=True)
class TransferFields:
    """The known fields of one ``kv_transfer_params`` object, typed and bounded."""

    do_remote_decode: bool = False
    do_remote_prefill: bool = False
    engine_id: str | None = None
    host: str | None = None
    port: int | None = None
    request_id: str | None = None
    block_ids: tuple[tuple[int, ...], ...] | None = None  # per attention group
    block_starts: tuple[int, ...] | None = None  # per attention group
    state: tuple[int, ...] | None = None  # staging entry per state group
    block_size: int | None = None
    num_tokens: int | None = None
    lease: tuple[int, int] | None = None  # (slot, generation)
    expires_ms: int | None = None  # epoch milliseconds after which a consumer refuses them
    prompt_digest: str | None = None  # hex digest of the prompt tokens [0, num_tokens)
    signature: str | None = None  # hex HMAC of the producer (``connectors/nixl/auth.py``)


def _fail(name: str, value: object, want: str) -> ValueError:
    return ValueError(
        f"invalid sampling parameter kv_transfer_params.{name}={short(value)}: must be {want}"
    )


def _int(params: dict[str, Any], name: str, low: int, high: int) -> int | None:
    value = params.get(name)
    if value is None:
        return None
    if not (is_int(value) and low <= value <= high):
        raise _fail(name, value, f"an integer in [{low}, {high}]")
    return int(value)


def _ints(value: object, name: str, limit: int, high: int = MAX_INDEX) -> tuple[int, ...]:
    if not (isinstance(value, list | tuple) and len(value) <= limit):
        raise _fail(name, value, f"a list of at most {limit} integers")
    # ``type(v) is int``: no bool, no float; then one pass each for the bounds
    if not all(type(v) is int for v in value) or (value and not 0 <= min(value) <= max(value) <= high):  # fmt: skip
        raise _fail(name, value, f"integers in [0, {high}]")
    return tuple(value)


def _text(params: dict[str, Any], name: str, pattern: re.Pattern[str] | None) -> str | None:
    value = params.get(name)
    if value is None:
        return None
    ok = isinstance(value, str) and 0 < len(value) <= MAX_ID_LEN
    if not ok or (pattern is not None and not pattern.fullmatch(value)):
        raise _fail(name, value, "a non-empty string of at most 256 characters" if pattern is None
                    else f"a string matching {pattern.pattern}")  # fmt: skip
    return str(value)


def _flag(params: dict[str, Any], name: str) -> bool:
    value = params.get(name, False)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise _fail(name, value, "true or false")
    return value


def _block_ids(params: dict[str, Any]) -> tuple[tuple[int, ...], ...] | None:
    value = params.get("remote_block_ids")
    if value is None:
        return None
    if not (isinstance(value, list | tuple) and len(value) <= MAX_GROUPS):
        raise _fail("remote_block_ids", value, f"a list of at most {MAX_GROUPS} lists")
    groups = tuple(_ints(t, "remote_block_ids", MAX_BLOCKS) for t in value)
    if sum(len(t) for t in groups) > MAX_BLOCKS:
        raise _fail("remote_block_ids", value, f"at most {MAX_BLOCKS} block ids in all")
    return groups


def _lease(params: dict[str, Any]) -> tuple[int, int] | None:
    value = params.get("remote_lease")
    if value is None:
        return None
    ok = isinstance(value, list | tuple) and len(value) == 2 and all(is_int(v) for v in value)
    if not (ok and 0 <= value[0] <= MAX_INDEX and 0 <= value[1] <= MAX_GENERATION):
        raise _fail("remote_lease", value, f"[slot, generation] in [0, {MAX_INDEX}] x "
                    f"[0, {MAX_GENERATION}]")  # fmt: skip
    return int(value[0]), int(value[1])


def _optional_ints(params: dict[str, Any], name: str) -> tuple[int, ...] | None:
    value = params.get(name)
    return None if value is None else _ints(value, name, MAX_GROUPS)


def parse_transfer_params(params: object) -> TransferFields:
    """The known fields of ``params``, typed and bounded; raises ValueError naming the field."""
    if not isinstance(params, dict):
        raise ValueError(
            f"invalid sampling parameter kv_transfer_params={short(params)}: must be an object"
        )
    if len(params) > MAX_KEYS:
        raise _fail("keys", list(params), f"at most {MAX_KEYS} keys")
    return TransferFields(
        do_remote_decode=_flag(params, "do_remote_decode"),
        do_remote_prefill=_flag(params, "do_remote_prefill"),
        engine_id=_text(params, "remote_engine_id", None),
        host=_text(params, "remote_host", HOST_PATTERN),
        port=_int(params, "remote_port", 1, 65535),
        request_id=_text(params, "remote_request_id", None),
        block_ids=_block_ids(params),
        block_starts=_optional_ints(params, "remote_block_starts"),
        state=_optional_ints(params, "remote_state"),
        block_size=_int(params, "remote_block_size", 1, 1 << 16),
        num_tokens=_int(params, "num_tokens", 0, MAX_INDEX),
        lease=_lease(params),
        expires_ms=_int(params, "remote_expires_ms", 0, MAX_EXPIRES_MS),
        prompt_digest=_text(params, "remote_prompt_digest", _HEX),
        signature=_text(params, "remote_signature", _HEX),
    )
