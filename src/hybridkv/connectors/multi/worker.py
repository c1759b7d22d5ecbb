"""The worker half of ``MultiConnector``: each child gets its own metadata; reports are merged."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from hybridkv.connectors.base import BaseConnectorWorker, KVCacheAccess
from hybridkv.connectors.outputs import merge_output
from hybridkv.connectors.stats import ConnectorStats, counter
from hybridkv.step_io import ConnectorMetadata, KVConnectorOutput

log = logging.getLogger(__name__)


@dataclass(slots=True)
class MultiMetadata(ConnectorMetadata):
    """``loads`` lists every child's loads (for whoever reads them); ``children[i]`` is what
    child i's scheduler half wrote for its worker half."""

    children: tuple[ConnectorMetadata, ...] = field(default_factory=tuple)


class MultiConnectorWorker(BaseConnectorWorker):
    def __init__(self, names: list[str], children: list[BaseConnectorWorker]) -> None:
        self.names = names
        self.children = children

    def register_kv_caches(self, cache: KVCacheAccess) -> None:
        self.cache = cache
        for child in self.children:
            child.register_kv_caches(cache)

    def _metas(self, metadata: ConnectorMetadata) -> tuple[ConnectorMetadata, ...]:
        if not isinstance(metadata, MultiMetadata) or len(metadata.children) != len(self.children):
            raise TypeError("MultiConnector's worker needs the metadata of its scheduler half")
        return metadata.children

    def start_load(self, metadata: ConnectorMetadata) -> None:
        for child, meta in zip(self.children, self._metas(metadata), strict=True):
            child.start_load(meta)

    def save(self, metadata: ConnectorMetadata) -> None:
        for child, meta in zip(self.children, self._metas(metadata), strict=True):
            child.save(meta)

    def get_finished(self, finished_request_ids: list[str]) -> KVConnectorOutput:
        total = KVConnectorOutput()
        for child in self.children:
            merge_output(total, child.get_finished(finished_request_ids))
        return total

    def has_pending(self) -> bool:
        return any(child.has_pending() for child in self.children)

    def needs_steps(self) -> bool:
        return any(child.needs_steps() for child in self.children)

    def wait_for_progress(self, timeout: float) -> None:
        pending = [c for c in self.children if c.has_pending()]
        for child in pending:  # NOTE: a child's wait returns when it progresses or times out
            child.wait_for_progress(timeout / len(pending))

    def wait_for_saves(self, timeout: float | None = None) -> bool:
        return all([child.wait_for_saves(timeout) for child in self.children])

    def take_stats(self) -> ConnectorStats:
        stats = MultiStats()
        merge_child_stats(stats, self.names, [c.take_stats() for c in self.children])
        return stats

    def shutdown(self) -> None:
        """Every child is shut down, even after one of them failed to (that is logged)."""
        for name, child in zip(self.names, self.children, strict=True):
            try:
                child.shutdown()
            except Exception:
                log.exception("MultiConnector: shutting down child %s failed", name)


@dataclass(slots=True)
class MultiStats(ConnectorStats):
    """The MultiConnector's own counts (which child loaded how much); each child's stats are
    under ``children`` by name (the ``connector`` label in ``/metrics``)."""

    selected: dict[str, int] = counter("selected.{}")
    selected_tokens: dict[str, int] = counter("selected_tokens.{}")
    waited: dict[str, int] = counter("waited.{}")  # lookups asked again for this child


def merge_child_stats(into: ConnectorStats, names: list[str], stats: list[ConnectorStats]) -> None:
    """Each child's stats under ``children`` by its name."""
    for name, child in zip(names, stats, strict=True):
        if name in into.children:
            into.children[name].merge(child)
        else:
            into.children[name] = child
