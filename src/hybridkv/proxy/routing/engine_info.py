"""``EngineInfo``: an engine's ``GET /kv_events`` answer (``kv_events/info.py``), parsed once
into typed, bounded values; a bad answer is a ``ValueError`` (that engine is routed by load)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from hybridkv.kv.hashing import HashAlgo, HashFn, get_hash_fn
from hybridkv.proxy.routing.index import GroupInfo

MAX_GROUPS = 64
MAX_BLOCK_SIZE = 1 << 16
MAX_ENDPOINT_CHARS = 512
KINDS = ("full_attention", "sliding_window", "mamba")
_WILDCARD_HOSTS = ("*", "0.0.0.0", "::", "[::]")


@dataclass(frozen=True, slots=True)
class EngineInfo:
    block_size: int
    hash_algo: HashAlgo
    groups: tuple[GroupInfo, ...]
    caching: bool
    endpoint: str | None  # the PUB endpoint as the proxy reaches it (None: events off)
    replay_endpoint: str | None
    topic: str

    @property
    def hash_fn(self) -> HashFn:
        return get_hash_fn(self.hash_algo)


def parse_engine_info(raw: Any, engine_url: str) -> EngineInfo:
    """The info route's JSON, checked; wildcard hosts in endpoints become the engine's host."""
    _need(isinstance(raw, dict), "the answer is not an object")
    events = raw.get("kv_events")
    _need(isinstance(events, dict), "kv_events is not an object")
    block_size = raw.get("block_size")
    _need(_is_int(block_size) and 0 < block_size <= MAX_BLOCK_SIZE, "bad block_size")
    try:
        algo = HashAlgo(raw.get("hash_algo"))
    except ValueError:
        raise ValueError(f"unknown hash_algo {raw.get('hash_algo')!r}") from None
    groups = raw.get("groups")
    _need(isinstance(groups, list) and 0 < len(groups) <= MAX_GROUPS, "bad groups")
    topic = events.get("topic", "")
    _need(isinstance(topic, str) and len(topic) <= MAX_ENDPOINT_CHARS, "bad topic")
    enabled = events.get("enabled") is True
    host = urlsplit(engine_url).hostname or "127.0.0.1"
    return EngineInfo(
        block_size=block_size,
        hash_algo=algo,
        groups=tuple(_group(g) for g in groups),
        caching=raw.get("caching") is True,
        endpoint=_endpoint(events.get("endpoint"), host) if enabled else None,
        replay_endpoint=_endpoint(events.get("replay_endpoint"), host) if enabled else None,
        topic=topic,
    )


def _group(raw: Any) -> GroupInfo:
    _need(isinstance(raw, dict) and raw.get("kind") in KINDS, "bad group kind")
    window = raw.get("sliding_window")
    _need(window is None or (_is_int(window) and window > 0), "bad sliding_window")
    return GroupInfo(raw["kind"], window)


def _endpoint(raw: Any, engine_host: str) -> str | None:
    if raw is None:
        return None
    _need(isinstance(raw, str) and len(raw) <= MAX_ENDPOINT_CHARS, "bad endpoint")
    return reachable_endpoint(raw, engine_host)


def reachable_endpoint(endpoint: str, engine_host: str) -> str:
    """``tcp://*:5557`` as the proxy connects to it: the engine's own host."""
    _need(endpoint.startswith(("tcp://", "ipc://")), f"endpoint {endpoint!r}: not tcp/ipc")
    if not endpoint.startswith("tcp://"):
        return endpoint
    host, _, port = endpoint[len("tcp://") :].rpartition(":")
    _need(port.isdigit() and 0 < int(port) < 65536, f"endpoint {endpoint!r}: bad port")
    if host in _WILDCARD_HOSTS:
        host = f"[{engine_host}]" if ":" in engine_host else engine_host
    return f"tcp://{host}:{port}"


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _need(ok: bool, what: str) -> None:
    if not ok:
        raise ValueError(f"kv_events info: {what}")
