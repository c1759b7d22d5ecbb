"""What signed ``kv_transfer_params`` cost per request (issue 26), CPU time, no engines.

    .venv/bin/python benchmarks/params_cost.py

Per prompt length (blocks of 16 tokens, two attention groups, one state entry):
- ``sign_us``: the producer's share at ``request_finished``: the fields parsed, the prompt
  digest, one HMAC-SHA256 (``auth.sign_params``).
- ``verify_us``: the consumer's, once per request: ``RemoteSource.parse`` (parse, HMAC, prompt
  digest, trusted host, expiry).
- ``hmac_us``: the HMAC alone over the canonical fields.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable

from hybridkv.connectors.nixl.auth import AuthKey, prompt_digest, sign_params, verify_params
from hybridkv.connectors.nixl.meta import ParamsPolicy, RemoteSource
from hybridkv.sampling.transfer_params import parse_transfer_params

KEY = AuthKey(b"benchmark-deployment-key", "bench")


def cpu_us(fn: Callable[[], object], n: int) -> float:
    start = time.process_time()
    for _ in range(n):
        fn()
    return (time.process_time() - start) / n * 1e6


def row(tokens: int) -> dict[str, float]:
    blocks = -(-tokens // 16)
    ids = list(range(3, tokens + 4))
    params = {
        "do_remote_prefill": True, "remote_engine_id": "hybridkv-0123456789abcdef",
        "remote_host": "127.0.0.1", "remote_port": 5600,
        "remote_request_id": "cmpl-0123456789abcdef0123456789abcdef",
        "remote_block_ids": [list(range(blocks))] * 2, "remote_block_starts": [0, 0],
        "remote_state": [3], "remote_block_size": 16, "num_tokens": tokens,
        "remote_lease": [1, 2], "remote_expires_ms": int(time.time() * 1000) + 600_000,
    }  # fmt: skip

    def sign() -> None:
        params["remote_prompt_digest"] = prompt_digest(ids[:tokens])
        params["remote_signature"] = sign_params(KEY, parse_transfer_params(params))

    sign()
    policy = ParamsPolicy(KEY, frozenset({"127.0.0.1"}))
    fields = parse_transfer_params(params)
    n = max(20, 20000 // max(1, tokens // 64))
    return {
        "tokens": tokens,
        "sign_us": round(cpu_us(sign, n), 1),
        "verify_us": round(
            cpu_us(
                lambda: RemoteSource.parse(parse_transfer_params(params), ids, (2, True), policy), n
            ),
            1,
        ),  # fmt: skip
        "hmac_us": round(cpu_us(lambda: verify_params(KEY, fields), n), 1),
    }


def main() -> None:
    for tokens in (128, 2000, 16000):
        print(json.dumps(row(tokens)))


if __name__ == "__main__":
    main()
