"""``kv_connector_extra_config`` of the ``OffloadingConnector``, validated at start-up.

::

    {"cpu_bytes": "4GiB", "disk_path": "./kv-cache", "disk_bytes": "50GiB",
     "chunk_tokens": 256, "eviction": "value", "load_timeout_seconds": 30,
     "offload_prompt_only": true, "max_inflight_io_bytes": "512MiB", "load_mode": "async",
     "cpu_prealloc": false,
     "remote_url": "valkey://127.0.0.1:6379/0", "remote_timeout_seconds": 2,
     "remote_key_prefix": "hybridkv:", "remote_ttl_seconds": null,
     "remote_auth_key_file": null, "remote_username": null, "remote_password_file": null,
     "remote_tls_ca_file": null, "remote_tls_cert_file": null, "remote_tls_key_file": null}

Any tier may be left out (not all three: ``cpu_bytes``, ``disk_path``, ``remote_url``). Sizes take plain bytes or KiB/MiB/GiB suffixes.
Each tier's keys are parsed by its ``TierOptions`` (``tier_registry``; the built-ins'
in each ``tiers/<name>/entry.py``) into ``tiers``; the built-ins' values are also this class's flat fields
(``cpu_bytes``, ``disk_path``, ``remote_url``...), the names the rest of the package reads.
``cpu_prealloc``: map and touch the CPU tier's memory at start-up (as vLLM's CPU offloading
does), so stores run at copy speed from the first one, at the cost of committing ``cpu_bytes``
and of ~1 s per 1-2 GiB of start-up.
The remote tier's key, credentials and TLS options: ``tiers.remote.key`` and ``tiers.remote.connect``.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any, TypeVar
from urllib.parse import parse_qs, urlsplit

from hybridkv.choice import parse_choice
from hybridkv.connectors.config import ConnectorOptions, LoadMode, OptionsContext
from hybridkv.connectors.offloading.policies import Eviction
from hybridkv.connectors.offloading.tier_registry import SHARED_KEYS, TierOptions, tier_entries
from hybridkv.paths import parse_bytes

MAX_TIMEOUT_SECONDS = 3600.0
_REMOTE_FILES = (
    "remote_auth_key_file",
    "remote_password_file",
    "remote_tls_ca_file",
    "remote_tls_cert_file",
    "remote_tls_key_file",
)
REMOTE_SCHEMES = ("valkey://", "redis://", "unix://", "valkeys://", "rediss://")
TLS_SCHEMES = ("valkeys://", "rediss://")
T = TypeVar("T", bound=TierOptions)


@dataclass(frozen=True, slots=True)
class OffloadingConfig(ConnectorOptions):
    cpu_bytes: int | None = None  # None: no CPU tier
    disk_path: str | None = None  # None: no disk tier
    disk_bytes: int | None = None
    chunk_tokens: int = 256  # tokens per restore unit, a multiple of the block size
    eviction: Eviction = Eviction.VALUE
    load_timeout_seconds: float = 30.0
    offload_prompt_only: bool = True
    max_inflight_io_bytes: int = 512 * 1024**2
    load_mode: LoadMode = LoadMode.ASYNC
    cpu_prealloc: bool = False
    remote_url: str | None = None  # None: no remote tier
    remote_timeout_seconds: float = 2.0
    remote_key_prefix: str = "hybridkv:"
    remote_ttl_seconds: int | None = None  # None: values never expire (Valkey may evict)
    remote_auth_key_file: str | None = None  # None: $HYBRIDKV_REMOTE_AUTH_KEY or generated
    remote_username: str | None = None  # an ACL user
    remote_password_file: str | None = None  # None: $HYBRIDKV_REMOTE_PASSWORD, if set
    remote_tls_ca_file: str | None = None  # TLS (valkeys:// URLs): the CA that signed the server
    remote_tls_cert_file: str | None = None  # mutual TLS: this client's certificate...
    remote_tls_key_file: str | None = None  # ... and its private key
    # every configured tier's options by tier name (built-in or registered), parsed by its entry
    tiers: Mapping[str, TierOptions] = field(default_factory=dict)

    @classmethod
    def parse(cls, extra: Mapping[str, Any], ctx: OptionsContext) -> OffloadingConfig:
        entries = tier_entries()
        known = set(SHARED_KEYS).union(*(e.options.KEYS for e in entries))
        for name in extra:
            if name not in known:
                raise ValueError(err(name, f"unknown key; known: {sorted(known)}"))
        values: dict[str, Any] = {}
        tiers: dict[str, TierOptions] = {}
        mine = {f.name for f in fields(cls)}
        for entry in entries:
            given = {k: extra[k] for k in entry.options.KEYS if k in extra}
            parsed = entry.options.parse(given, ctx)
            if parsed is not None:
                tiers[entry.name] = parsed
                # a field named as its own key and as a field here: a built-in's flat field
                own = mine & set(entry.options.KEYS)
                values.update(
                    {f.name: getattr(parsed, f.name) for f in fields(parsed) if f.name in own}
                )
        if not tiers:
            raise ValueError(err("cpu_bytes", "give cpu_bytes, disk_path, remote_url or several"))
        if "max_inflight_io_bytes" in extra:
            values["max_inflight_io_bytes"] = size_value(extra, "max_inflight_io_bytes")
        values["chunk_tokens"] = _chunk_tokens(extra.get("chunk_tokens", 256), ctx.block_size)
        values.update(_choices(extra))
        return cls(**values, tiers=tiers)

    def tier_options(self, name: str, kind: type[T]) -> T | None:
        """Tier ``name``'s parsed options as its own type; None if it is not configured."""
        options = self.tiers.get(name)
        if options is not None and not isinstance(options, kind):
            raise TypeError(f"tier {name!r}: options are {type(options).__name__}")
        return options


def check_sizes(options: OffloadingConfig, unit_bytes: int, max_model_len: int) -> None:
    """What the options must satisfy once the layout is known (at connector creation): each
    tier holds at least one restore unit (``unit_bytes``) and a unit fits in the context.
    ``ValueError`` naming the option otherwise."""
    what = f"one restore unit ({unit_bytes} bytes at chunk_tokens={options.chunk_tokens})"
    for name in ("cpu_bytes", "disk_bytes"):
        value = getattr(options, name)
        if value is not None and value < unit_bytes:
            raise ValueError(
                err(name, f"{value} bytes is less than {what}: nothing would be stored")
            )
    if max_model_len and options.chunk_tokens > max_model_len:
        raise ValueError(
            err(
                "chunk_tokens",
                f"{options.chunk_tokens} is above max_model_len={max_model_len}: no unit could ever be stored",
            )
        )


def check_memory(cpu_bytes: int, prealloc: bool) -> None:
    """The CPU tier's memory must exist (before the model loads): at most the machine's
    memory, or its available memory with ``cpu_prealloc`` (issue 18: memory grew until
    the process was killed)."""
    total, available = memory_limits()
    limit, which = (available, "available") if prealloc else (total, "total")
    if limit and cpu_bytes > limit:
        raise ValueError(
            err(
                "cpu_bytes",
                f"{cpu_bytes} bytes is more than this machine's {which} memory ({limit} bytes)",
            )
        )


def memory_limits() -> tuple[int, int]:
    """(total, available) memory in bytes, within this process's cgroup limit if any; 0 if
    unknown."""
    info: dict[str, int] = {}
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                key, _, rest = line.partition(":")
                info[key] = int(rest.split()[0]) * 1024
    except (OSError, ValueError, IndexError):
        return 0, 0
    total, available = info.get("MemTotal", 0), info.get("MemAvailable", 0)
    try:
        with open("/sys/fs/cgroup/memory.max") as f:
            cap = f.read().strip()
        with open("/sys/fs/cgroup/memory.current") as f:
            current = int(f.read().strip())
    except (OSError, ValueError):
        return total, available
    if cap.isdigit():
        total, available = min(total, int(cap)), min(available, max(0, int(cap) - current))
    return total, available


def remote_values(extra: Mapping[str, Any]) -> dict[str, Any]:
    """The ``remote_*`` keys checked (given or not), as ``OffloadingConfig`` field values."""
    out: dict[str, Any] = {}
    url = extra.get("remote_url")
    if url is not None:
        if not isinstance(url, str) or not url.startswith(REMOTE_SCHEMES):
            raise ValueError(err("remote_url", f"{url!r} must start with one of {REMOTE_SCHEMES}"))
        parts = urlsplit(url)
        if parts.password is not None or "password" in parse_qs(parts.query):
            raise ValueError(
                err("remote_url", "holds a password (visible in ps): use remote_password_file")
            )
        out["remote_url"] = url
    out["remote_timeout_seconds"] = _seconds(extra, "remote_timeout_seconds", 2.0)
    prefix = extra.get("remote_key_prefix", "hybridkv:")
    if not isinstance(prefix, str):
        raise ValueError(err("remote_key_prefix", f"{prefix!r} must be a string"))
    out["remote_key_prefix"] = prefix
    ttl = extra.get("remote_ttl_seconds")
    if ttl is not None and (isinstance(ttl, bool) or not isinstance(ttl, int) or ttl <= 0):
        raise ValueError(err("remote_ttl_seconds", f"{ttl!r} must be a whole number > 0"))
    out["remote_ttl_seconds"] = ttl
    out.update(_remote_access(extra, url))
    return out


def _remote_access(extra: Mapping[str, Any], url: str | None) -> dict[str, Any]:
    """Key, credentials and TLS files: non-empty strings, given only with ``remote_url``, the
    TLS files only with a TLS URL."""
    out: dict[str, Any] = {}
    for name in (*_REMOTE_FILES, "remote_username"):
        value = extra.get(name)
        if value is None:
            continue
        if not isinstance(value, str | os.PathLike) or not os.fspath(value):
            raise ValueError(err(name, f"{value!r} must be a non-empty string"))
        if url is None:
            raise ValueError(err(name, "is only used with remote_url"))
        if name.startswith("remote_tls_") and not url.startswith(TLS_SCHEMES):
            raise ValueError(err(name, f"needs a TLS remote_url (one of {TLS_SCHEMES})"))
        out[name] = str(os.fspath(value))
    return out


def _seconds(extra: Mapping[str, Any], name: str, default: float) -> float:
    value = extra.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise ValueError(err(name, f"{value!r} must be a number > 0"))
    return float(value)


def _chunk_tokens(value: Any, block_size: int) -> int:
    ok = isinstance(value, int) and not isinstance(value, bool) and value > 0
    if not ok or value % block_size:
        raise ValueError(
            err("chunk_tokens", f"{value!r} must be a positive multiple of {block_size}")
        )
    return int(value)


def _choices(extra: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    out["eviction"] = parse_choice(
        Eviction, extra.get("eviction", "value"), "OffloadingConnector: 'eviction'"
    )
    mode = extra.get("load_mode", "async")
    out["load_mode"] = parse_choice(LoadMode, mode, "OffloadingConnector: 'load_mode'")
    timeout = extra.get("load_timeout_seconds", 30.0)
    number = not isinstance(timeout, bool) and isinstance(timeout, int | float)
    if not number or not math.isfinite(timeout) or not 0 < timeout <= MAX_TIMEOUT_SECONDS:
        raise ValueError(
            err(
                "load_timeout_seconds",
                f"{timeout!r} must be a number in (0, {MAX_TIMEOUT_SECONDS}]",
            )
        )
    out["load_timeout_seconds"] = float(timeout)
    out["offload_prompt_only"] = flag(extra, "offload_prompt_only", True)
    return out


def flag(extra: Mapping[str, Any], name: str, default: bool) -> bool:
    value = extra.get(name, default)
    if not isinstance(value, bool):
        raise ValueError(err(name, f"{value!r} must be true or false"))
    return value


def path_value(extra: Mapping[str, Any], name: str) -> str:
    path = extra[name]
    if not isinstance(path, str | os.PathLike) or not os.fspath(path):
        raise ValueError(err(name, "must be a directory path"))
    return str(os.fspath(path))


def size_value(extra: Mapping[str, Any], name: str) -> int:
    try:
        return parse_bytes(extra[name], name)
    except (ValueError, TypeError) as exc:
        raise ValueError(err(name, str(exc))) from None


def err(name: str, message: str) -> str:
    return f"OffloadingConnector: {name!r}: {message}"
