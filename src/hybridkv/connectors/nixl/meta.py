"""Plain data between the NixlConnector's halves and between engines (``kv_transfer_params``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Lease:
    """A producer's lease on one request's KV: word ``slot`` of its lease words reads ``gen``
    while it holds the KV (see ``leases``)."""

    slot: int
    gen: int

    @classmethod
    def parse(cls, value: Any) -> Lease | None:
        if value is None:
            return None
        slot, gen = (int(v) for v in value)
        return cls(slot, gen)


@dataclass(frozen=True, slots=True)
class RemoteSource:
    """A consumer's view of a producer's ``kv_transfer_params`` (validated)."""

    engine_id: str
    host: str
    port: int
    request_id: str
    block_ids: tuple[tuple[int, ...], ...]  # per attention group, from table index ``first``
    first_blocks: tuple[int, ...]  # per attention group
    staged_state: int | None  # the producer's staging entry holding the state at num_tokens
    num_tokens: int  # tokens whose KV the producer holds: [0, num_tokens)
    lease: Lease | None = None  # where the producer publishes whether it still holds them
    block_size: int = 0  # the producer's tokens per block (0: not given)

    @classmethod
    def parse(cls, params: dict[str, Any], num_attn: int, has_state: bool) -> RemoteSource:
        """Raises ValueError naming the bad field."""
        try:
            src = cls(
                engine_id=str(params["remote_engine_id"]),
                host=str(params["remote_host"]),
                port=int(params["remote_port"]),
                request_id=str(params["remote_request_id"]),
                block_ids=tuple(tuple(int(b) for b in t) for t in params["remote_block_ids"]),
                first_blocks=tuple(int(k) for k in params["remote_block_starts"]),
                staged_state=_first(params.get("remote_state") or []),
                num_tokens=int(params["num_tokens"]),
                lease=Lease.parse(params.get("remote_lease")),
                block_size=int(params.get("remote_block_size") or 0),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"kv_transfer_params: missing or malformed field {exc}") from None
        if len(src.block_ids) != num_attn or len(src.first_blocks) != num_attn:
            raise ValueError(
                f"kv_transfer_params: remote_block_ids has {len(src.block_ids)} groups, "
                f"this engine has {num_attn} attention groups"
            )
        if src.num_tokens > 0 and src.lease is None:
            raise ValueError("kv_transfer_params: remote_lease is required")
        if src.num_tokens > 0 and has_state and src.staged_state is None:
            raise ValueError("kv_transfer_params: remote_state is required for state groups")
        return src


def _first(values: list[Any]) -> int | None:
    """``remote_state`` lists the staging entry per state group (one entry holds them all)."""
    return int(values[0]) if values else None


@dataclass(frozen=True, slots=True)
class StageState:
    """Producer: after this step's forward, copy these state slots (the live ones when the step
    ends at E, the checkpoint restored at E when it starts there) to a staging entry."""

    request_id: str
    index: int
    slots: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class StartLease:
    """Producer: the request's KV waits for a consumer's read until the lease expires."""

    request_id: str
    seconds: float
    lease: Lease


@dataclass(frozen=True, slots=True)
class NotifyOnly:
    """Consumer: nothing to read (full local hit, or aborted): tell the producer to free."""

    source: RemoteSource


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """Consumer: tell the producer of ``source`` (its engine, host and port) that its requests
    ``request_ids`` still wait here, so it keeps their KV (see ``heartbeats``)."""

    source: RemoteSource
    request_ids: tuple[str, ...]
