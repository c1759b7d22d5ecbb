"""Connectors found by name; modules are imported only when a connector is created."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass

from hybridkv.connectors.base import KVConnectorPair
from hybridkv.connectors.config import KVTransferConfig
from hybridkv.kv.spec import KVCacheLayout

_REGISTRY: dict[str, str] = {
    "FileConnector": "hybridkv.connectors.file_connector:create_file_connector",
    "FaultInjection": "hybridkv.connectors.fault_injection:create_fault_injection",
    "OffloadingConnector": "hybridkv.connectors.offloading.connector:create_offloading_connector",
}


@dataclass(frozen=True, slots=True)
class ConnectorContext:
    """What a connector learns about the engine at start-up (plain data)."""

    layout: KVCacheLayout
    fingerprint: str  # layout + model identity; salts every key that leaves the process
    num_blocks: int
    num_state_slots: int
    max_model_len: int = 0  # 0: not known


Factory = Callable[[KVTransferConfig, ConnectorContext], KVConnectorPair]


def register_connector(name: str, target: str) -> None:
    """Register ``"module.path:factory"`` under ``name`` (for out-of-tree connectors)."""
    _REGISTRY[name] = target


def connector_names() -> list[str]:
    return sorted(_REGISTRY)


def create_connector(config: KVTransferConfig, context: ConnectorContext) -> KVConnectorPair:
    target = _REGISTRY.get(config.kv_connector)
    if target is None:
        raise ValueError(
            f"unknown kv_connector {config.kv_connector!r}; available: {', '.join(connector_names())}"
        )
    module_name, _, attr = target.partition(":")
    try:
        factory: Factory = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise ValueError(
            f"kv_connector {config.kv_connector!r} is not available here: {exc}"
        ) from None
    return factory(config, context)
