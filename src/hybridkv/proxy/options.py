"""What the proxy trusts and how long it waits: its own limits, its engines' timeouts and keys.

::

    client --(api_key, BodyLimit, JSON parsed once)--> proxy --(backend_api_key)--> engines
            <-- a 4xx/5xx in OpenAI's shape; a stream ends with an error event, never cut --

The client's own ``kv_transfer_params`` are dropped (the decode engine reads whatever host and
blocks they name) unless ``allow_client_kv_transfer_params``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from hybridkv.proxy.routing.options import RoutingOptions
from hybridkv.server.limits import ServerLimits

# a non-streamed answer is read whole before it is sent on (so a failure can still be a 502)
MAX_ANSWER_BYTES = 256 << 20
# a kept-alive engine connection is not reused after this long idle: below the engines' own
# keep-alive (hybridkv serve and vLLM: 5 s), so the engine never closes one as it is reused
ENGINE_KEEPALIVE_SECONDS = 2.0


@dataclass(frozen=True, slots=True)
class EngineTimeouts:
    """Per call to an engine (``hybridkv proxy`` flags of the same names)."""

    connect_seconds: float = 5.0  # TCP connect; a refused or unreachable engine: the next one
    first_byte_seconds: float = 300.0  # the answer's headers and first chunk (a whole prefill)
    idle_seconds: float = 60.0  # between two chunks of an answer
    health_seconds: float = 2.0  # one /health probe
    health_interval_seconds: float = 5.0  # between two rounds of probes

    def __post_init__(self) -> None:
        for name, flag in TIMEOUT_FLAGS.items():
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ValueError(f"{flag} must be a number, got {value!r}")
            if not math.isfinite(value) or value <= 0:
                raise ValueError(f"{flag} must be a finite number > 0, got {value!r}")


TIMEOUT_FLAGS = {
    "connect_seconds": "--connect-timeout",
    "first_byte_seconds": "--first-byte-timeout",
    "idle_seconds": "--idle-timeout",
    "health_seconds": "--health-timeout",
    "health_interval_seconds": "--health-interval",
}


@dataclass(frozen=True, slots=True)
class ProxyOptions:
    limits: ServerLimits = field(default_factory=ServerLimits)  # bodies, headers, stalls
    timeouts: EngineTimeouts = field(default_factory=EngineTimeouts)
    api_key: str | None = None  # clients must send it (/v1/*)
    backend_api_key: str | None = None  # sent to engines; None: the client's Authorization
    allow_client_kv_transfer_params: bool = False
    routing: RoutingOptions = field(default_factory=RoutingOptions)  # docs/routing.md

    def engine_headers(self, client_authorization: str | None) -> dict[str, str]:
        """The headers of a call to an engine on behalf of a client."""
        if self.backend_api_key is not None:
            return {"authorization": f"Bearer {self.backend_api_key}"}
        if client_authorization is not None:
            return {"authorization": client_authorization}
        return {}
