"""``kv_transfer_config``: vLLM's keys, validated at start-up."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

ROLES = ("kv_producer", "kv_consumer", "kv_both")
POLICIES = ("recompute", "fail")
_KEYS = {"kv_connector", "kv_role", "kv_connector_extra_config", "kv_load_failure_policy"}


@dataclass(frozen=True, slots=True)
class KVTransferConfig:
    kv_connector: str
    kv_role: str = "kv_both"
    kv_connector_extra_config: dict[str, Any] = field(default_factory=dict)
    kv_load_failure_policy: str = "recompute"

    def __post_init__(self) -> None:
        if not isinstance(self.kv_connector, str) or not self.kv_connector:
            raise ValueError("kv_transfer_config: 'kv_connector' must name a connector")
        if self.kv_role not in ROLES:
            raise ValueError(f"kv_transfer_config: kv_role={self.kv_role!r} must be one of {ROLES}")
        if self.kv_load_failure_policy not in POLICIES:
            raise ValueError(
                f"kv_transfer_config: kv_load_failure_policy={self.kv_load_failure_policy!r} "
                f"must be one of {POLICIES}"
            )
        if not isinstance(self.kv_connector_extra_config, dict):
            raise ValueError("kv_transfer_config: 'kv_connector_extra_config' must be an object")

    @classmethod
    def parse(cls, value: KVTransferConfig | dict[str, Any] | str) -> KVTransferConfig:
        """From a dict, a JSON string (the CLI's ``--kv-transfer-config``) or itself."""
        if isinstance(value, KVTransferConfig):
            return value
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except json.JSONDecodeError as exc:
                raise ValueError(f"kv_transfer_config is not valid JSON: {exc.msg}") from None
        if not isinstance(value, dict):
            raise ValueError("kv_transfer_config must be a JSON object")
        unknown = set(value) - _KEYS
        if unknown:
            raise ValueError(
                f"kv_transfer_config: unknown keys {sorted(unknown)}; known: {sorted(_KEYS)}"
            )
        if "kv_connector" not in value:
            raise ValueError("kv_transfer_config: 'kv_connector' is required")
        return cls(**value)
