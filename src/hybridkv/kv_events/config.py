"""``KVEventsConfig``: vLLM's ``--kv-events-config`` keys, parsed once into a frozen config.

::

    --kv-events-config '{"enable_kv_cache_events": true, "publisher": "zmq",
                         "endpoint": "tcp://*:5557", "topic": "kv-events"}'

Keys and defaults are vLLM's (``vllm/config/kv_events.py``). An unknown key, a value of the
wrong type or out of range is an error naming the key.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from hybridkv.choice import json_object

PUBLISHERS = ("null", "zmq")
_ENDPOINT_SCHEMES = ("tcp://", "ipc://", "inproc://")


@dataclass(frozen=True, slots=True)
class KVEventsConfig:
    enable_kv_cache_events: bool = False  # publish events at all
    publisher: str = "zmq"  # "zmq" (a PUB socket), or "null" (build the batches, send none)
    endpoint: str = (
        "tcp://*:5557"  # bound when it has '*', '::', ipc:// or inproc://, else connected
    )
    replay_endpoint: str | None = None  # a ROUTER socket serving missed batches by sequence
    buffer_steps: int = 10_000  # batches kept for replay
    hwm: int = 100_000  # the PUB socket's send high-water mark (messages)
    max_queue_size: int = 100_000  # batches waiting for the publisher thread (oldest dropped)
    topic: str = ""  # the first frame of every message

    def __post_init__(self) -> None:
        _check_type("enable_kv_cache_events", self.enable_kv_cache_events, bool)
        for name in ("publisher", "endpoint", "topic"):
            _check_type(name, getattr(self, name), str)
        for name in ("buffer_steps", "hwm", "max_queue_size"):
            value = getattr(self, name)
            _check_type(name, value, int)
            if value < 1:
                raise ValueError(f"kv_events_config: {name}={value!r} must be a positive integer")
        if self.publisher not in PUBLISHERS:
            raise ValueError(
                f"kv_events_config: publisher={self.publisher!r} is not one of {list(PUBLISHERS)}"
            )
        _check_endpoint("endpoint", self.endpoint)
        if self.replay_endpoint is not None:
            _check_type("replay_endpoint", self.replay_endpoint, str)
            _check_endpoint("replay_endpoint", self.replay_endpoint)

    @property
    def enabled(self) -> bool:
        return self.enable_kv_cache_events


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
