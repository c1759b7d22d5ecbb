"""A test deployment key and params signed with it, as a producer of that deployment would."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from hybridkv.connectors.nixl.auth import AuthKey, prompt_digest, sign_params
from hybridkv.connectors.nixl.meta import ParamsPolicy
from hybridkv.sampling.transfer_params import parse_transfer_params

TEST_KEY = AuthKey(b"test-deployment-key-0123456789", "tests")
TRUSTED = frozenset({"127.0.0.1", "localhost", "::1"})


def policy(key: AuthKey = TEST_KEY) -> ParamsPolicy:
    return ParamsPolicy(key, TRUSTED)


def signed(
    params: dict[str, Any],
    key: AuthKey = TEST_KEY,
    ttl: float = 600.0,
    prompt: Sequence[int] = (),
) -> dict[str, Any]:
    """``params`` with an expiry ``ttl`` seconds ahead and ``key``'s signature for a request
    whose tokens are ``prompt`` (its first ``num_tokens`` count)."""
    out = {**params, "remote_expires_ms": int((time.time() + ttl) * 1000)}
    out.pop("remote_signature", None)
    out["remote_prompt_digest"] = prompt_digest(list(prompt)[: out.get("num_tokens") or 0])
    out["remote_signature"] = sign_params(key, parse_transfer_params(out))
    return out
