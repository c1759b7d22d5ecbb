"""``kv_connector_extra_config`` of the ``OffloadingConnector``, validated at start-up.

::

    {"cpu_bytes": "4GiB", "disk_path": "./kv-cache", "disk_bytes": "50GiB",
     "chunk_tokens": 256, "eviction": "lru", "load_timeout_seconds": 30,
     "offload_prompt_only": true, "max_inflight_io_bytes": "512MiB", "load_mode": "async",
     "cpu_prealloc": false}

Either tier may be left out (not both). Sizes take plain bytes or KiB/MiB/GiB suffixes.
``cpu_prealloc``: map and touch the CPU tier's memory at start-up (as vLLM's CPU offloading
does), so stores run at copy speed from the first one, at the cost of committing ``cpu_bytes``
and of ~1 s per 1-2 GiB of start-up.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from hybridkv.connectors.config import ConnectorOptions, LoadMode, OptionsContext, parse_choice
from hybridkv.connectors.offloading.policies import Eviction
from hybridkv.paths import parse_bytes

_KEYS = (
    "cpu_bytes",
    "disk_path",
    "disk_bytes",
    "chunk_tokens",
    "eviction",
    "load_timeout_seconds",
    "offload_prompt_only",
    "max_inflight_io_bytes",
    "load_mode",
    "cpu_prealloc",
)


@dataclass(frozen=True, slots=True)
class OffloadingConfig(ConnectorOptions):
    cpu_bytes: int | None = None  # None: no CPU tier
    disk_path: str | None = None  # None: no disk tier
    disk_bytes: int | None = None
    chunk_tokens: int = 256  # tokens per restore unit, a multiple of the block size
    eviction: Eviction = Eviction.LRU
    load_timeout_seconds: float = 30.0
    offload_prompt_only: bool = True
    max_inflight_io_bytes: int = 512 * 1024**2
    load_mode: LoadMode = LoadMode.ASYNC
    cpu_prealloc: bool = False

    @classmethod
    def parse(cls, extra: Mapping[str, Any], ctx: OptionsContext) -> OffloadingConfig:
        for name in extra:
            if name not in _KEYS:
                raise ValueError(_err(name, f"unknown key; known: {sorted(_KEYS)}"))
        values: dict[str, Any] = {}
        for name in ("cpu_bytes", "disk_bytes", "max_inflight_io_bytes"):
            if name in extra:
                values[name] = _size(extra, name)
        if "disk_path" in extra:
            path = extra["disk_path"]
            if not isinstance(path, str | os.PathLike) or not os.fspath(path):
                raise ValueError(_err("disk_path", "must be a directory path"))
            values["disk_path"] = str(os.fspath(path))
            if "disk_bytes" not in values:
                raise ValueError(_err("disk_bytes", "is required with disk_path"))
        elif "disk_bytes" in values:
            raise ValueError(_err("disk_path", "is required with disk_bytes"))
        if "cpu_bytes" not in values and "disk_path" not in values:
            raise ValueError(_err("cpu_bytes", "give cpu_bytes, disk_path or both"))
        values["chunk_tokens"] = _chunk_tokens(extra.get("chunk_tokens", 256), ctx.block_size)
        values.update(_choices(extra))
        return cls(**values)


def _chunk_tokens(value: Any, block_size: int) -> int:
    ok = isinstance(value, int) and not isinstance(value, bool) and value > 0
    if not ok or value % block_size:
        raise ValueError(
            _err("chunk_tokens", f"{value!r} must be a positive multiple of {block_size}")
        )
    return int(value)


def _choices(extra: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    out["eviction"] = parse_choice(
        Eviction, extra.get("eviction", "lru"), "OffloadingConnector: 'eviction'"
    )
    mode = extra.get("load_mode", "async")
    out["load_mode"] = parse_choice(LoadMode, mode, "OffloadingConnector: 'load_mode'")
    timeout = extra.get("load_timeout_seconds", 30.0)
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout <= 0:
        raise ValueError(_err("load_timeout_seconds", f"{timeout!r} must be a number > 0"))
    out["load_timeout_seconds"] = float(timeout)
    for name, default in (("offload_prompt_only", True), ("cpu_prealloc", False)):
        value = extra.get(name, default)
        if not isinstance(value, bool):
            raise ValueError(_err(name, f"{value!r} must be true or false"))
        out[name] = value
    return out


def _size(extra: Mapping[str, Any], name: str) -> int:
    try:
        return parse_bytes(extra[name], name)
    except (ValueError, TypeError) as exc:
        raise ValueError(_err(name, str(exc))) from None


def _err(name: str, message: str) -> str:
    return f"OffloadingConnector: {name!r}: {message}"
