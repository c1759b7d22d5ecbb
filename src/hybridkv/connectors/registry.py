"""Connectors found by name. An entry names two things, both imported only when used:

- ``options``: the connector's ``ConnectorOptions`` subclass, whose ``parse`` checks
  ``kv_connector_extra_config`` at the boundary (``parse_kv_transfer_config``, called when the
  ``EngineConfig`` is built: before any weight is read). Keep its module free of torch.
- ``factory``: ``create(config: KVTransferConfig, context: ConnectorContext) ->
  KVConnectorPair``, called once the engine knows its layout; it reads
  ``config.options_as(ItsOptions)``.

A connector that wraps or combines others (``FaultInjection``, a ``MultiConnector``) parses each
child's ``kv_transfer_config`` in its own ``parse`` with ``parse_kv_transfer_config`` and
creates each child in its factory with ``create_connector``.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import cast

from hybridkv.choice import json_object, parse_choice
from hybridkv.connectors.base import KVConnectorPair
from hybridkv.connectors.config import (
    KEYS,
    ConnectorOptions,
    KVRole,
    KVTransferConfig,
    LoadFailurePolicy,
    OptionsContext,
)
from hybridkv.kv.spec import KVCacheLayout


@dataclass(frozen=True, slots=True)
class ConnectorEntry:
    """``"module.path:attr"`` of the connector's options class and of its factory."""

    options: str
    factory: str


_REGISTRY: dict[str, ConnectorEntry] = {
    "FileConnector": ConnectorEntry(
        "hybridkv.connectors.file.connector:FileConnectorConfig",
        "hybridkv.connectors.file.connector:create_file_connector",
    ),
    "FaultInjection": ConnectorEntry(
        "hybridkv.connectors.fault.plan:FaultConfig",
        "hybridkv.connectors.fault.connector:create_fault_injection",
    ),
    "OffloadingConnector": ConnectorEntry(
        "hybridkv.connectors.offloading.config:OffloadingConfig",
        "hybridkv.connectors.offloading.connector:create_offloading_connector",
    ),
    "MultiConnector": ConnectorEntry(
        "hybridkv.connectors.multi.config:MultiConfig",
        "hybridkv.connectors.multi.connector:create_multi_connector",
    ),
    "NixlConnector": ConnectorEntry(
        "hybridkv.connectors.nixl.options:NixlOptions",
        "hybridkv.connectors.nixl.connector:create_nixl_connector",
    ),
}


@dataclass(frozen=True, slots=True)
class ConnectorContext:
    """What a connector learns about the engine at start-up (plain data)."""

    layout: KVCacheLayout
    fingerprint: str  # layout + model identity; salts every key that leaves the process
    num_blocks: int
    num_state_slots: int
    model_id: str = ""  # architecture, weights identity and dtype (handshake compatibility)
    max_model_len: int = 0  # 0: not known


Factory = Callable[[KVTransferConfig, ConnectorContext], KVConnectorPair]


def register_connector(name: str, options: str, factory: str) -> None:
    """Register an (out-of-tree) connector: ``options`` and ``factory`` as ``"module:attr"``."""
    _REGISTRY[name] = ConnectorEntry(options, factory)


def connector_names() -> list[str]:
    return sorted(_REGISTRY)


def parse_kv_transfer_config(value: object, block_size: int) -> KVTransferConfig:
    """From a dict, a JSON string (the CLI's ``--kv-transfer-config``) or itself; the
    connector's extra config is parsed by its entry. Errors name the bad key (anything else
    is a ValueError too)."""
    if isinstance(value, KVTransferConfig):
        return value
    value = json_object(value, "kv_transfer_config", sorted(KEYS))
    name = value.get("kv_connector")
    if not isinstance(name, str) or not name:
        raise ValueError("kv_transfer_config: 'kv_connector' is required (a connector name)")
    role = parse_choice(KVRole, value.get("kv_role", "kv_both"), "kv_transfer_config: kv_role")
    policy = parse_choice(
        LoadFailurePolicy,
        value.get("kv_load_failure_policy", "recompute"),
        "kv_transfer_config: kv_load_failure_policy",
    )
    extra = value.get("kv_connector_extra_config", {})
    if not isinstance(extra, Mapping):
        raise ValueError("kv_transfer_config: 'kv_connector_extra_config' must be an object")
    options = _options_class(name).parse(extra, OptionsContext(block_size))
    return KVTransferConfig(name, options, role, policy, dict(extra))


def create_connector(config: KVTransferConfig, context: ConnectorContext) -> KVConnectorPair:
    factory = cast(Factory, _load(config.kv_connector, _entry(config.kv_connector).factory))
    return factory(config, context)


def _options_class(name: str) -> type[ConnectorOptions]:
    kind = _load(name, _entry(name).options)
    if not (isinstance(kind, type) and issubclass(kind, ConnectorOptions)):
        raise ValueError(f"kv_connector {name!r}: {_entry(name).options} is not ConnectorOptions")
    return kind


def _entry(name: str) -> ConnectorEntry:
    entry = _REGISTRY.get(name)
    if entry is None:
        raise ValueError(
            f"unknown kv_connector {name!r}; available: {', '.join(connector_names())}"
        )
    return entry


def _load(name: str, target: str) -> object:
    module_name, _, attr = target.partition(":")
    try:
        return getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"kv_connector {name!r} is not available here: {exc}") from None
