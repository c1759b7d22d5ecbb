"""A producer and a consumer EngineCore with NixlConnector in one process (two NIXL agents
talking over UCX on loopback), and the bytes a transfer must move, computed from the layout."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hybridkv.engine.core import EngineCore
from hybridkv.engine.output import RequestOutput
from hybridkv.kv.spec import FullAttentionSpec, KVCacheLayout, SlidingWindowSpec, dtype_bytes
from hybridkv.sampling.params import SamplingParams
from tests.engine.helpers import make_engine
from tests.server.harness import free_port

MAX_TOKENS = 6


def nixl(role: str, policy: str = "recompute", **extra: Any) -> dict[str, Any]:
    return {
        "kv_connector": "NixlConnector",
        "kv_role": role,
        "kv_connector_extra_config": extra,
        "kv_load_failure_policy": policy,
    }


def producer(model: Path, block_size: int = 16, **extra: Any) -> EngineCore:
    config = nixl("kv_producer", side_channel_port=free_port(), **extra)
    return make_engine(model, block_size=block_size, kv_transfer_config=config)


def consumer(
    model: Path, block_size: int = 16, policy: str = "recompute", **extra: Any
) -> EngineCore:
    config = nixl("kv_consumer", policy, **extra)
    return make_engine(model, block_size=block_size, kv_transfer_config=config)


def run(
    engine: EngineCore, prompt: list[int], params: SamplingParams, *others: EngineCore
) -> RequestOutput:
    """Step ``engine`` (and ``others``, so a producer answers reads) until the request ends."""
    req = engine.add_request(prompt, params)
    while True:
        for out in engine.step():
            if out.request_id == req.request_id and out.finished:
                return out
        for other in others:
            if other.has_unfinished_requests():
                other.step()


def drain(*engines: EngineCore, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while any(e.has_unfinished_requests() for e in engines):
        assert time.monotonic() < deadline, "engines did not go idle"
        for e in engines:
            if e.has_unfinished_requests():
                e.step()


def drain_clean(*engines: EngineCore) -> None:
    """Drain, then every engine's KV is consistent and holds nothing (no leaked block)."""
    drain(*engines)
    for e in engines:
        e.kv.check_integrity()
        assert e.kv.is_idle()


def greedy(max_tokens: int = MAX_TOKENS, params: dict[str, Any] | None = None) -> SamplingParams:
    extra = {"kv_transfer_params": params} if params is not None else None
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, extra_args=extra)


@dataclass
class Transfer:
    prefill: RequestOutput
    decode: RequestOutput


def outliving(p: EngineCore, params: dict[str, Any] | None, prompt: list[int]) -> dict[str, Any]:
    """``params`` re-signed by producer ``p`` to expire in 10 minutes: a test whose lease
    expires on purpose still reaches the lease word check (else the consumer refuses the
    expired params up front)."""
    from tests.connectors.nixl.signing import signed

    assert params is not None and p.connector is not None
    key = p.connector.scheduler.policy.key  # type: ignore[attr-defined]
    return signed(params, key, prompt=prompt)


def disaggregated(p: EngineCore, d: EngineCore, prompt: list[int]) -> Transfer:
    pre = run(p, prompt, greedy(1, {"do_remote_decode": True}))
    assert pre.kv_transfer_params is not None and pre.kv_transfer_params["do_remote_prefill"]
    dec = run(d, prompt, greedy(MAX_TOKENS, pre.kv_transfer_params), p)
    drain(p, d)
    return Transfer(pre, dec)


def expected_bytes(layout: KVCacheLayout, end: int, local: int, block_size: int) -> int:
    """Full groups: tokens [local, end); sliding groups: the consumer's whole blocks of the
    window ending at ``end``; state groups: one slot."""
    total = layout.total_state_slot_bytes() if end else 0
    for g in layout.groups:
        spec = g.spec
        if not isinstance(spec, FullAttentionSpec | SlidingWindowSpec):
            continue
        lo = local
        if isinstance(spec, SlidingWindowSpec):
            lo = max(lo, max(0, end - spec.sliding_window + 1) // block_size * block_size)
        token = 2 * spec.num_kv_heads * spec.head_size * dtype_bytes(spec.dtype)
        total += max(0, end - lo) * token * len(g.layer_ids)
    return total


def unclipped_bytes(layout: KVCacheLayout, num_tokens: int) -> int:
    """Every prompt block of every attention group, plus one state slot per state group."""
    blocks = -(-num_tokens // layout.block_size)
    attn = len(layout.attention_group_ids) * blocks * layout.page_bytes
    return attn + layout.total_state_slot_bytes()
