"""What ``FaultInjection`` breaks: its config and the reproducible per-load decisions.

Every decision is a hash of ``(seed, request id, where)`` (``fault_draw``), never of thread
timing or call order, so the same seed and requests break the same parts in every run.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field

from hybridkv.connectors.config import (
    ConnectorOptions,
    KVTransferConfig,
    OptionsContext,
    parse_number,
)
from hybridkv.connectors.registry import parse_kv_transfer_config
from hybridkv.step_io import FailureReason, LoadSpec

INJECTED = FailureReason.INJECTED
CORRUPT = FailureReason.CORRUPT
TIMEOUT = FailureReason.TIMEOUT
_RATES = ("block_failure_rate", "request_failure_rate", "corrupt_rate")
_KEYS = {"inner", *_RATES, "delay_seconds", "load_timeout_seconds", "seed"}
MAX_SECONDS = 3600.0  # delays and timeouts: finite and below an hour


@dataclass(frozen=True, slots=True)
class FaultConfig(ConnectorOptions):
    inner: KVTransferConfig
    block_failure_rate: float = 0.0
    request_failure_rate: float = 0.0
    corrupt_rate: float = 0.0
    delay_seconds: float = 0.0
    load_timeout_seconds: float = 30.0
    seed: int = 0

    @classmethod
    def parse(cls, extra: Mapping[str, object], ctx: OptionsContext) -> FaultConfig:
        for name in extra:
            if name not in _KEYS:
                raise ValueError(f"FaultInjection: unknown key {name!r}; known: {sorted(_KEYS)}")
        if "inner" not in extra:
            raise ValueError("FaultInjection: 'inner' (the wrapped kv_transfer_config) is required")
        try:
            inner = parse_kv_transfer_config(extra["inner"], ctx.block_size)
        except (ValueError, TypeError) as exc:
            raise ValueError(f"FaultInjection: 'inner': {exc}") from None
        values: dict[str, float] = {}
        for name in _RATES:
            values[name] = _number(extra, name, 0.0, high=1.0)
        values["delay_seconds"] = _number(extra, "delay_seconds", 0.0, high=MAX_SECONDS)
        values["load_timeout_seconds"] = _number(
            extra, "load_timeout_seconds", 30.0, high=MAX_SECONDS, low_open=True
        )
        seed = extra.get("seed", 0)
        if not isinstance(seed, int) or isinstance(seed, bool):
            raise ValueError(f"FaultInjection: 'seed'={seed!r} must be an integer")
        return cls(inner=inner, seed=seed, **values)


def _number(
    extra: Mapping[str, object], name: str, default: float, high: float, low_open: bool = False
) -> float:
    where = f"FaultInjection: {name!r}"
    return parse_number(extra.get(name, default), where, 0.0, high, low_open=low_open)


def fault_draw(seed: int, request_id: str, *where: object) -> float:
    """A uniform number in [0, 1) that depends only on its arguments."""
    blob = "\x1f".join([str(seed), request_id, *map(str, where)]).encode()
    return int.from_bytes(hashlib.blake2b(blob, digest_size=8).digest(), "little") / 2.0**64


@dataclass(slots=True)
class FaultPlan:
    """What to break in one load: the whole request, or some blocks (id -> reason) and states
    (state group id -> reason)."""

    request_reason: FailureReason | None = None
    blocks: dict[int, FailureReason] = field(default_factory=dict)
    states: dict[int, FailureReason] = field(default_factory=dict)


def plan_faults(config: FaultConfig, spec: LoadSpec, state_group_ids: tuple[int, ...]) -> FaultPlan:
    seed, rid = config.seed, spec.request_id
    if fault_draw(seed, rid, "request") < config.request_failure_rate:
        return FaultPlan(request_reason=INJECTED)
    plan = FaultPlan()
    for group, (ids, indices) in enumerate(zip(spec.block_ids, spec.block_indices, strict=True)):
        for block_id, k in zip(ids, indices, strict=True):
            reason = _part_reason(config, rid, "block", group, k)
            if reason is not None:
                plan.blocks[block_id] = reason
    for gid in state_group_ids[: len(spec.state_slots)]:
        reason = _part_reason(config, rid, "state", gid, spec.end)
        if reason is not None:
            plan.states[gid] = reason
    return plan


def _part_reason(config: FaultConfig, rid: str, *where: object) -> FailureReason | None:
    if fault_draw(config.seed, rid, "fail", *where) < config.block_failure_rate:
        return INJECTED
    if fault_draw(config.seed, rid, "corrupt", *where) < config.corrupt_rate:
        return CORRUPT
    return None
