"""The state-checkpoint families of ``/metrics`` (specs in ``table.ENGINE_METRICS``): what the
checkpoint books admitted, refused (the shortfall), evicted and served, and the bytes held
against the budget's."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from hybridkv.kv.checkpoint_counters import CheckpointStats

Family = Callable[..., GaugeMetricFamily | CounterMetricFamily]


def checkpoint_families(c: CheckpointStats, family: Family) -> Iterator[Metric]:
    for name, counts in (
        ("hybridkv:state_checkpoints_admitted", c.admitted),
        ("hybridkv:state_checkpoints_refused", c.refused),
        ("hybridkv:state_checkpoints_evicted", c.evicted),
        ("hybridkv:state_checkpoint_hits", c.hits),
    ):
        yield _labelled(family(name), counts)
    yield family("hybridkv:state_checkpoint_bytes", c.held_bytes)
    yield family("hybridkv:state_checkpoint_budget_bytes", c.budget_bytes or 0)


def _labelled(f: GaugeMetricFamily | CounterMetricFamily, counts: Mapping[str, int]) -> Metric:
    for label, n in sorted(counts.items()):
        f.add_metric([label], n)
    return f
