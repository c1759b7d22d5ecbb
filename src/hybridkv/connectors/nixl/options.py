"""The NixlConnector's ``kv_connector_extra_config``, parsed and checked at start-up."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from hybridkv.connectors.config import ConnectorOptions, OptionsContext
from hybridkv.connectors.nixl.agent import ERROR_MODES


@dataclass(frozen=True, slots=True)
class NixlOptions(ConnectorOptions):
    """``side_channel_host``/``side_channel_port``: where a producer serves its handshake
    (two engines on one host need distinct ports). ``abort_timeout_seconds``: a producer frees
    a request's KV after this long if no consumer read it (its lease). ``load_timeout_seconds``:
    a consumer gives up on a read (handshake included) after this long and recovers.
    ``max_staged_states``: state checkpoints a producer can hold for consumers at once.
    ``max_leases``: requests a producer can hold for consumers at once.
    ``heartbeat_interval_seconds``: how often a consumer tells each producer which of its
    requests still wait here (the producer extends their leases; keep it well below the
    producer's ``abort_timeout_seconds``); 0 disables heartbeats.
    ``ucx_error_handling_mode``: ``peer`` (NIXL's default, safe across hosts) or ``none``
    (faster on one host: UCX's shared-memory transports; see ``agent.ucx_params``);
    ``HYBRIDKV_NIXL_UCX_ERROR_MODE`` in the environment overrides it."""

    side_channel_host: str = "127.0.0.1"
    side_channel_port: int = 5600
    abort_timeout_seconds: float = 120.0
    load_timeout_seconds: float = 30.0
    handshake_timeout_seconds: float = 5.0
    max_staged_states: int = 64
    max_leases: int = 4096
    ucx_error_handling_mode: str = "peer"
    heartbeat_interval_seconds: float = 10.0

    def __post_init__(self) -> None:
        if not isinstance(self.side_channel_port, int) or not 0 <= self.side_channel_port < 65536:
            raise ValueError(
                f"NixlConnector: side_channel_port={self.side_channel_port!r} must be a port number"
            )
        for name in ("abort_timeout_seconds", "load_timeout_seconds", "handshake_timeout_seconds"):
            value = getattr(self, name)
            if not isinstance(value, int | float) or value <= 0:
                raise ValueError(f"NixlConnector: {name}={value!r} must be a positive number")
        if self.ucx_error_handling_mode not in ERROR_MODES:
            raise ValueError(
                f"NixlConnector: ucx_error_handling_mode={self.ucx_error_handling_mode!r} "
                "must be 'peer' or 'none'"
            )
        interval = self.heartbeat_interval_seconds
        if (
            isinstance(interval, bool)
            or not isinstance(interval, int | float)
            or not (0 <= interval < float("inf"))
        ):
            raise ValueError(
                f"NixlConnector: heartbeat_interval_seconds={interval!r} must be a number of "
                "seconds >= 0 (0 disables heartbeats)"
            )
        for name in ("max_staged_states", "max_leases"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"NixlConnector: {name}={value!r} must be an integer >= 1")

    @classmethod
    def parse(cls, extra: Mapping[str, Any], ctx: OptionsContext | None = None) -> NixlOptions:
        known = {f.name for f in fields(cls)}
        unknown = set(extra) - known
        if unknown:
            raise ValueError(
                f"NixlConnector: unknown kv_connector_extra_config keys {sorted(unknown)}; "
                f"known: {sorted(known)}"
            )
        return cls(**extra)
