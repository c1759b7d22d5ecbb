"""``MultiConnector``'s options: the children and the selection, parsed and validated.

Config (``kv_connector_extra_config``)::

    {"connectors": [{"kv_connector": "OffloadingConnector", "kv_connector_extra_config": {...},
                     "load_weight": 1.0, "name": "local"}, {...}],
     "selection": "cost"}

Contract: ``MultiConfig.parse`` returns a frozen config or raises ``ValueError`` naming the
bad key or child (``connectors[i]``); each child's own ``kv_transfer_config`` is parsed by the
registry, a child may not be another ``MultiConnector``, child names are unique and without
dots (they become the ``connector`` label of their counters).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from hybridkv.connectors.config import ConnectorOptions, KVTransferConfig, OptionsContext
from hybridkv.connectors.multi.select import Selection
from hybridkv.connectors.registry import parse_kv_transfer_config

_KEYS = ("connectors", "selection")
_CHILD_KEYS = ("load_weight", "name")


@dataclass(frozen=True, slots=True)
class ChildConfig:
    name: str
    load_weight: float
    config: KVTransferConfig
    role_given: bool  # False: the child takes the MultiConnector's kv_role


@dataclass(frozen=True, slots=True)
class MultiConfig(ConnectorOptions):
    children: tuple[ChildConfig, ...] = ()
    selection: Selection = Selection.COST

    @classmethod
    def parse(cls, extra: Mapping[str, object], ctx: OptionsContext) -> MultiConfig:
        unknown = set(extra) - set(_KEYS)
        if unknown:
            raise ValueError(f"MultiConnector: unknown keys {sorted(unknown)}; known: {_KEYS}")
        items = extra.get("connectors")
        if not isinstance(items, list) or not items:
            raise ValueError("MultiConnector: 'connectors' must be a non-empty list")
        selection = extra.get("selection", "cost")
        if selection not in [s.value for s in Selection]:
            raise ValueError(
                f"MultiConnector: 'selection'={selection!r} must be one of "
                f"{[s.value for s in Selection]}"
            )
        children = tuple(_child(i, item, ctx) for i, item in enumerate(items))
        names = [c.name for c in children]
        if len(set(names)) != len(names):
            raise ValueError(f"MultiConnector: child names must differ: {names}")
        return cls(children, Selection(selection))


def _child(index: int, item: object, ctx: OptionsContext) -> ChildConfig:
    where = f"MultiConnector: connectors[{index}]"
    if not isinstance(item, dict):
        raise ValueError(f"{where} must be a kv_transfer_config object")
    raw = {k: v for k, v in item.items() if k not in _CHILD_KEYS}
    if raw.get("kv_connector") == "MultiConnector":
        raise ValueError(f"{where}: a MultiConnector cannot nest another")
    try:
        config = parse_kv_transfer_config(raw, ctx.block_size)
    except ValueError as exc:
        raise ValueError(f"{where}: {exc}") from None
    weight = item.get("load_weight", 1.0)
    if isinstance(weight, bool) or not isinstance(weight, int | float) or weight < 0:
        raise ValueError(f"{where}: 'load_weight'={weight!r} must be a number >= 0")
    name = item.get("name", f"{index}.{config.kv_connector}")
    if not isinstance(name, str) or not name or "." in name.removeprefix(f"{index}."):
        raise ValueError(f"{where}: 'name'={name!r} must be a non-empty name without dots")
    return ChildConfig(name, float(weight), config, "kv_role" in raw)
