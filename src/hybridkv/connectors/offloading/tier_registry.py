"""The ``OffloadingConnector``'s tiers, found by name: one ``TierEntry`` per tier.

An entry says everything the rest of the engine needs of a tier::

    name      "cpu"                   Tier.name, the ``tier`` label of stats and metrics
    medium    "CPU"                   the ``medium`` of its KV events (``kv_events``)
    options   CpuOptions              a frozen ``TierOptions`` dataclass; ``KEYS`` are its flat
                                      keys in ``kv_connector_extra_config`` (``cpu_bytes``...)
    create    create(options, build)  the ``Tier``, once the layout is known
    order     10                      its place in the stack, fastest (lowest) first

The built-in tiers (``builtin_tiers``: cpu, disk, remote) are loaded on first use; another
tier is one ``register_tier(entry)`` (a test-only tier registers from its test). This module
imports no torch: ``OffloadingConfig.parse`` and the KV events collector read it at the
boundary.
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Generic, Protocol, TypeVar

from hybridkv.connectors.config import OptionsContext
from hybridkv.connectors.offloading.policies import Eviction

if TYPE_CHECKING:
    from hybridkv.connectors.offloading.tier_base import Tier
    from hybridkv.connectors.offloading.units import UnitGeometry

# a string, imported on first use: the built-ins import this module
_BUILTINS = "hybridkv.connectors.offloading.builtin_tiers"
# the connector's own keys (``OffloadingConfig``), which no tier may take
SHARED_KEYS = (
    "chunk_tokens",
    "eviction",
    "load_timeout_seconds",
    "offload_prompt_only",
    "max_inflight_io_bytes",
    "load_mode",
)


@dataclass(frozen=True, slots=True)
class TierOptions:
    """Base of a tier's parsed options. A subclass lists its flat keys in ``KEYS`` and parses
    them in ``parse``: ``extra`` holds only those keys (as given); None when the tier is not
    configured; a ValueError naming the key for a bad value. No torch, no files."""

    KEYS: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def parse(cls, extra: Mapping[str, Any], ctx: OptionsContext) -> TierOptions | None:
        raise NotImplementedError(f"{cls.__name__}.parse")


class SharedOptions(Protocol):
    """What a tier may read of the connector's own options (the ``OffloadingConfig``)."""

    @property
    def eviction(self) -> Eviction: ...

    @property
    def load_timeout_seconds(self) -> float: ...

    @property
    def chunk_tokens(self) -> int: ...


@dataclass(frozen=True, slots=True)
class TierBuild:
    """What a tier factory gets besides its own options."""

    shared: SharedOptions  # the OffloadingConfig
    geometry: UnitGeometry
    unit_bytes: int  # the largest restore unit's bytes
    fingerprint: str  # layout + model identity: salts every key that leaves the process


Opts = TypeVar("Opts", bound=TierOptions)


@dataclass(frozen=True, slots=True)
class TierEntry(Generic[Opts]):
    name: str
    medium: str
    options: type[Opts]
    create: Callable[[Opts, TierBuild], Tier]
    order: int


_lock = threading.Lock()
_entries: dict[str, TierEntry[Any]] = {}
_loaded = False


def register_tier(entry: TierEntry[Any]) -> None:
    """Add a tier. ValueError if its name, its medium or one of its keys is taken."""
    taken = set(entry.options.KEYS) & set(SHARED_KEYS)
    if taken or not entry.options.KEYS or not entry.name or not entry.medium:
        raise ValueError(f"tier {entry.name!r}: needs a name, a medium and keys of its own")
    with _lock:
        entries = _registry()
        for other in entries.values():
            clash = set(entry.options.KEYS) & set(other.options.KEYS)
            if other.name == entry.name or other.medium == entry.medium or clash:
                raise ValueError(f"tier {entry.name!r} clashes with tier {other.name!r}")
        entries[entry.name] = entry


def unregister_tier(name: str) -> None:
    with _lock:
        _registry().pop(name, None)


def tier_entries() -> list[TierEntry[Any]]:
    """Every registered tier, fastest first."""
    with _lock:
        return sorted(_registry().values(), key=lambda e: (e.order, e.name))


def tier_medium(name: str) -> str:
    """The KV events' ``medium`` of tier ``name``; an unregistered name (a tier dropped from
    the registry while its last events drain) is its upper-cased name, never an error on the
    engine thread."""
    with _lock:
        entry = _registry().get(name)
    return name.upper() if entry is None else entry.medium


def _registry() -> dict[str, TierEntry[Any]]:
    global _loaded
    if not _loaded:
        builtins: tuple[TierEntry[Any], ...] = importlib.import_module(_BUILTINS).BUILTIN_TIERS
        for entry in builtins:
            _entries.setdefault(entry.name, entry)
        _loaded = True
    return _entries
