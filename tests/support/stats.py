"""Connector stats as flat ``name -> value`` counters, for tests that count by name.

The names are the ``kv_connector_events`` labels plus ``load_failures:<reason>``,
``offload_bytes.<tier>.<direction>`` and ``offload_seconds.<tier>.<direction>`` (children
folded in, as ``/metrics`` shows them)."""

from __future__ import annotations

from hybridkv.connectors.stats import ConnectorStats


def flat_counters(stats: ConnectorStats | None) -> dict[str, float]:
    if stats is None:
        return {}
    flat = stats.flatten()
    out: dict[str, float] = dict(flat.events)
    out.update({f"load_failures:{r}": n for r, n in flat.load_failures.items() if n})
    for name, values in (("offload_bytes", flat.offload_bytes),
                         ("offload_seconds", flat.offload_seconds)):  # fmt: skip
        out.update({f"{name}.{t}.{d}": v for (t, d), v in values.items()})
    return out


def counters_with_children(stats: ConnectorStats | None) -> dict[str, float]:
    """``flat_counters`` plus each child's own as ``connector.<name>.<counter>``."""
    out = flat_counters(stats)
    for name, child in stats.children.items() if stats is not None else ():
        out.update({f"connector.{name}.{k}": v for k, v in flat_counters(child).items()})
    return out
