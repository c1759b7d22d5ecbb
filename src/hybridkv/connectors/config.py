"""``kv_transfer_config``: vLLM's keys, parsed once at the boundary into typed values.

``parse_kv_transfer_config`` (in ``registry.py``) turns a dict or a JSON string into a
``KVTransferConfig`` whose ``options`` is the connector's own frozen dataclass, parsed by the
connector's registry entry before any model weight is read. Everything past the boundary reads
the typed config; nothing re-parses it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TypeVar

from hybridkv.choice import Choice

KEYS = ("kv_connector", "kv_role", "kv_connector_extra_config", "kv_load_failure_policy")


class KVRole(Choice):
    PRODUCER = "kv_producer"  # saves only
    CONSUMER = "kv_consumer"  # loads only
    BOTH = "kv_both"

    @property
    def loads(self) -> bool:
        return self is not KVRole.PRODUCER

    @property
    def saves(self) -> bool:
        return self is not KVRole.CONSUMER


class LoadFailurePolicy(Choice):
    """What the scheduler does with a request whose external KV failed to load."""

    RECOMPUTE = "recompute"  # compute the tokens again (never a wrong token)
    FAIL = "fail"  # finish the request with an error


class LoadMode(Choice):
    ASYNC = "async"  # the request waits (WAITING_FOR_REMOTE_KVS) while its bytes land
    SYNC = "sync"  # bytes land before the step's forward pass


class TierName(Choice):
    """Where external KV lives; the ``tier`` label of the offload metrics."""

    CPU = "cpu"
    DISK = "disk"
    REMOTE = "remote"


def parse_number(
    value: object, where: str, low: float, high: float, *, low_open: bool = False
) -> float:
    """``value`` as a finite float in ``[low, high]`` (``(low, high]`` if ``low_open``), or a
    ValueError naming ``where``: NaN, infinities and bools are refused (NaN compares false
    with every bound, so a plain range check lets it through)."""
    ok = (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(value)
        and (low < value if low_open else low <= value)
        and value <= high
    )
    if not ok:
        bounds = f"{'(' if low_open else '['}{low:g}, {high:g}]"
        raise ValueError(f"{where}={value!r} must be a finite number in {bounds}")
    return float(value)  # type: ignore[arg-type]


@dataclass(frozen=True, slots=True)
class OptionsContext:
    """What an options parser may check against: engine options known before the model loads."""

    block_size: int


@dataclass(frozen=True, slots=True)
class ConnectorOptions:
    """Base of every connector's parsed ``kv_connector_extra_config`` (a frozen dataclass).

    A subclass adds its fields and a classmethod
    ``parse(extra: Mapping[str, object], ctx: OptionsContext) -> Self`` that rejects unknown keys
    and bad values with a ValueError naming the option; it must not import torch or touch
    files (it runs at the boundary, before the model loads)."""

    @classmethod
    def parse(cls, extra: Mapping[str, object], ctx: OptionsContext) -> ConnectorOptions:
        raise NotImplementedError(f"{cls.__name__}.parse")


@dataclass(frozen=True, slots=True)
class NoOptions(ConnectorOptions):
    """For a connector that takes no ``kv_connector_extra_config``."""

    @classmethod
    def parse(cls, extra: Mapping[str, object], ctx: OptionsContext) -> NoOptions:
        if extra:
            raise ValueError(f"unknown keys {sorted(extra)} in kv_connector_extra_config")
        return cls()


Opt = TypeVar("Opt", bound=ConnectorOptions)


@dataclass(frozen=True, slots=True)
class KVTransferConfig:
    kv_connector: str
    options: ConnectorOptions  # the connector's parsed kv_connector_extra_config
    kv_role: KVRole = KVRole.BOTH
    kv_load_failure_policy: LoadFailurePolicy = LoadFailurePolicy.RECOMPUTE
    kv_connector_extra_config: Mapping[str, object] = field(default_factory=dict)  # as given

    def options_as(self, kind: type[Opt]) -> Opt:
        """``options`` as the connector's own type (a factory's first line)."""
        if not isinstance(self.options, kind):
            raise TypeError(
                f"{self.kv_connector}: options are {type(self.options).__name__}, "
                f"expected {kind.__name__}"
            )
        return self.options
