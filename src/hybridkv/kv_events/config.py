"""``KVEventsConfig``: vLLM's ``--kv-events-config`` keys, parsed once into a frozen config.

::

    --kv-events-config '{"enable_kv_cache_events": true, "publisher": "zmq",
                         "endpoint": "tcp://*:5557", "topic": "kv-events"}'

Keys are vLLM's (``vllm/config/kv_events.py``), and so are the defaults but where events
would leave the host: with no ``endpoint`` the PUB socket binds ``tcp://127.0.0.1:5557``
(vLLM: ``tcp://*:5557``), and a replay endpoint on another address than loopback needs
``allow_remote_replay``. hybridkv's own keys: ``bind``, ``omit_token_ids``,
``allow_remote_replay``, ``heartbeat_seconds``. An unknown key, a value of the wrong type or out of range is an error
naming the key.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from hybridkv.choice import json_object

PUBLISHERS = ("null", "zmq")
DEFAULT_ENDPOINT = "tcp://127.0.0.1:5557"
_ENDPOINT_SCHEMES = ("tcp://", "ipc://", "inproc://")
_LOOPBACK_HOSTS = ("localhost", "::1", "[::1]", "lo")


@dataclass(frozen=True, slots=True)
class KVEventsConfig:
    enable_kv_cache_events: bool = False  # publish events at all
    publisher: str = "zmq"  # "zmq" (a PUB socket), or "null" (build the batches, send none)
    endpoint: str | None = None  # None: DEFAULT_ENDPOINT, bound (loopback only)
    replay_endpoint: str | None = None  # a ROUTER socket serving missed batches by sequence
    buffer_steps: int = 10_000  # batches kept for replay
    hwm: int = 100_000  # the PUB socket's send high-water mark (messages)
    max_queue_size: int = 100_000  # batches waiting for the publisher thread (oldest dropped)
    topic: str = ""  # the first frame of every message
    # None: vLLM's rule (bound when it has '*', '::', ipc:// or inproc://, else connected)
    bind: bool | None = None
    omit_token_ids: bool = False  # True: no event carries token ids (salted requests': never)
    allow_remote_replay: bool = False  # a replay endpoint off loopback (serves the history)
    heartbeat_seconds: float = 1.0  # an idle publisher's empty batch, this often (0: never)

    def __post_init__(self) -> None:
        for name in ("enable_kv_cache_events", "omit_token_ids", "allow_remote_replay"):
            _check_type(name, getattr(self, name), bool)
        if self.bind is not None:
            _check_type("bind", self.bind, bool)
        for name in ("publisher", "topic"):
            _check_type(name, getattr(self, name), str)
        for name in ("buffer_steps", "hwm", "max_queue_size"):
            value = getattr(self, name)
            _check_type(name, value, int)
            if value < 1:
                raise ValueError(f"kv_events_config: {name}={value!r} must be a positive integer")
        beat = self.heartbeat_seconds
        if isinstance(beat, bool) or not isinstance(beat, int | float):
            raise ValueError(f"kv_events_config: heartbeat_seconds={beat!r} must be a number")
        if not 0 <= beat <= 3600:  # NaN fails too
            raise ValueError(f"kv_events_config: heartbeat_seconds={beat!r} must be in [0, 3600]")
        if self.publisher not in PUBLISHERS:
            raise ValueError(
                f"kv_events_config: publisher={self.publisher!r} is not one of {list(PUBLISHERS)}"
            )
        if self.endpoint is not None:
            _check_type("endpoint", self.endpoint, str)
            _check_endpoint("endpoint", self.endpoint)
        if self.replay_endpoint is not None:
            _check_type("replay_endpoint", self.replay_endpoint, str)
            _check_endpoint("replay_endpoint", self.replay_endpoint)
            if not self.allow_remote_replay and not is_loopback(self.replay_endpoint):
                raise ValueError(
                    f"kv_events_config: replay_endpoint={self.replay_endpoint!r} is reachable "
                    "from other hosts, and the replay socket serves the last buffer_steps "
                    "batches to whoever asks: use a loopback address (tcp://127.0.0.1:PORT) or "
                    "ipc://, or set allow_remote_replay=true on an isolated network"
                )

    @property
    def enabled(self) -> bool:
        return self.enable_kv_cache_events

    @property
    def pub_endpoint(self) -> str:
        return DEFAULT_ENDPOINT if self.endpoint is None else self.endpoint

    @property
    def binds(self) -> bool:
        """Whether the PUB socket binds ``pub_endpoint`` (else it connects to a subscriber
        that bound it): ``bind`` if given, else vLLM's rule; the default endpoint binds."""
        if self.bind is not None:
            return self.bind
        endpoint = self.pub_endpoint
        return (
            self.endpoint is None
            or "*" in endpoint
            or "::" in endpoint
            or endpoint.startswith(("ipc://", "inproc://"))
        )


def is_loopback(endpoint: str) -> bool:
    """Whether only this host can reach ``endpoint`` once bound: ipc://, inproc://, or a
    tcp:// address on 127.0.0.0/8, ::1, ``localhost`` or the ``lo`` interface."""
    if not endpoint.startswith("tcp://"):
        return True
    host = endpoint[len("tcp://") :].rpartition(":")[0]
    return host in _LOOPBACK_HOSTS or host.startswith("127.")


KEYS = tuple(f.name for f in fields(KVEventsConfig))


def parse_kv_events_config(value: KVEventsConfig | Mapping[str, Any] | str) -> KVEventsConfig:
    """From a dict, a JSON string (the CLI's ``--kv-events-config``) or itself."""
    if isinstance(value, KVEventsConfig):
        return value
    value = json_object(value, "kv_events_config", list(KEYS))
    return KVEventsConfig(**value)


def _check_type(name: str, value: object, want: type) -> None:
    ok = isinstance(value, want) and (want is bool or not isinstance(value, bool))
    if not ok:
        raise ValueError(
            f"kv_events_config: {name}={value!r} must be a {want.__name__}, "
            f"not {type(value).__name__}"
        )


def _check_endpoint(name: str, endpoint: str) -> None:
    if not endpoint.startswith(_ENDPOINT_SCHEMES):
        raise ValueError(
            f"kv_events_config: {name}={endpoint!r} must start with one of "
            f"{', '.join(_ENDPOINT_SCHEMES)}"
        )
