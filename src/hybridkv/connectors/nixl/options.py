"""The NixlConnector's ``kv_connector_extra_config``, parsed and checked at start-up."""

from __future__ import annotations

import ipaddress
import math
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from hybridkv.connectors.config import ConnectorOptions, OptionsContext
from hybridkv.connectors.nixl.agent import ERROR_MODES
from hybridkv.sampling.transfer_params import HOST_PATTERN

LOOPBACK = frozenset({"127.0.0.1", "localhost", "::1"})
MAX_SECONDS = 7 * 86400.0  # every duration option
MAX_COUNT = 1 << 20  # staged states, leases


def is_loopback(host: str) -> bool:
    if host in LOOPBACK:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True, slots=True)
class NixlOptions(ConnectorOptions):
    """``side_channel_host``/``side_channel_port``: where a producer serves its handshake
    (two engines on one host need distinct ports). ``abort_timeout_seconds``: a producer frees
    a request's KV after this long if no consumer read it (its lease). ``load_timeout_seconds``:
    a consumer gives up on a read (handshake included) after this long and recovers.
    ``handshake_timeout_seconds``: the whole side-channel exchange's deadline.
    ``max_staged_states``: state checkpoints a producer can hold for consumers at once.
    ``max_leases``: requests a producer can hold for consumers at once.
    ``heartbeat_interval_seconds``: how often a consumer tells each producer which of its
    requests still wait here (the producer extends their leases; keep it well below the
    producer's ``abort_timeout_seconds``); 0 disables heartbeats.
    ``ucx_error_handling_mode``: ``peer`` (NIXL's default, safe across hosts) or ``none``
    (faster on one host: UCX's shared-memory transports; see ``agent.ucx_params``);
    ``HYBRIDKV_NIXL_UCX_ERROR_MODE`` in the environment overrides it.
    ``auth_key_file``: the deployment's shared secret (``auth``; else
    ``$HYBRIDKV_KV_AUTH_KEY``; else, on one host, a generated key in the cache directory).
    ``trusted_hosts``: producer hosts a consumer reads from, besides loopback and its own
    ``side_channel_host`` (params naming any other host are refused).
    ``ucx_net_devices``: the network devices UCX uses (``UCX_NET_DEVICES`` syntax, e.g.
    ``eth1`` or ``mlx5_0:1``); default ``lo`` on a single host, else every device
    (``$UCX_NET_DEVICES`` wins over both)."""

    side_channel_host: str = "127.0.0.1"
    side_channel_port: int = 5600
    abort_timeout_seconds: float = 120.0
    load_timeout_seconds: float = 30.0
    handshake_timeout_seconds: float = 5.0
    max_staged_states: int = 64
    max_leases: int = 4096
    ucx_error_handling_mode: str = "peer"
    heartbeat_interval_seconds: float = 10.0
    auth_key_file: str | None = None
    trusted_hosts: tuple[str, ...] = ()
    ucx_net_devices: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.side_channel_port, int) or not 0 <= self.side_channel_port < 65536:
            raise ValueError(
                f"NixlConnector: side_channel_port={self.side_channel_port!r} must be a port number"
            )
        for name in ("abort_timeout_seconds", "load_timeout_seconds", "handshake_timeout_seconds"):
            _check_seconds(name, getattr(self, name), 0.0, allow_low=False)
        _check_seconds("heartbeat_interval_seconds", self.heartbeat_interval_seconds, 0.0, True)
        if self.ucx_error_handling_mode not in ERROR_MODES:
            raise ValueError(
                f"NixlConnector: ucx_error_handling_mode={self.ucx_error_handling_mode!r} "
                "must be 'peer' or 'none'"
            )
        for name in ("max_staged_states", "max_leases"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_COUNT:
                raise ValueError(f"NixlConnector: {name}={value!r} must be an integer in "
                                 f"[1, {MAX_COUNT}]")  # fmt: skip
        self._check_hosts()

    def _check_hosts(self) -> None:
        hosts = self.trusted_hosts
        if isinstance(hosts, str) or not isinstance(hosts, list | tuple):
            raise ValueError(f"NixlConnector: trusted_hosts={hosts!r} must be a list of hosts")
        object.__setattr__(self, "trusted_hosts", tuple(hosts))
        for host in (self.side_channel_host, *hosts):
            if not isinstance(host, str) or not HOST_PATTERN.fullmatch(host):
                raise ValueError(f"NixlConnector: host {host!r} (side_channel_host or "
                                 "trusted_hosts) must be a host name or IP address")  # fmt: skip
        devices = self.ucx_net_devices
        if devices is not None and not (isinstance(devices, str) and HOST_PATTERN.fullmatch(devices.replace(",", "."))):  # fmt: skip
            raise ValueError(f"NixlConnector: ucx_net_devices={devices!r} must be UCX device names "
                             "like 'eth1' or 'mlx5_0:1,eth1'")  # fmt: skip
        key = self.auth_key_file
        if key is not None and not (isinstance(key, str) and key):
            raise ValueError(f"NixlConnector: auth_key_file={key!r} must be a file path")

    def trusted(self) -> frozenset[str]:
        """Hosts whose params a consumer accepts: loopback, its own side channel's host, and
        ``trusted_hosts``."""
        return LOOPBACK | {self.side_channel_host, *self.trusted_hosts}

    def single_host(self) -> bool:
        """Every host this engine serves or trusts is loopback (a generated key suffices)."""
        return all(is_loopback(h) for h in (self.side_channel_host, *self.trusted_hosts))

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


def _check_seconds(name: str, value: object, low: float, allow_low: bool) -> None:
    """A duration must be a finite number in range: NaN would make every comparison false
    (a lease that never expires), inf a deadline that never comes."""
    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    if ok and (value > low or (allow_low and value == low)) and value <= MAX_SECONDS:  # type: ignore[operator]
        return
    want = "a number of seconds >= 0 (0 disables heartbeats)" if allow_low else "a positive number"
    raise ValueError(f"NixlConnector: {name}={value!r} must be {want}, finite and at most "
                     f"{MAX_SECONDS:g}")  # fmt: skip
