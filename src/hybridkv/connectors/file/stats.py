"""``FileConnector``'s counters."""

from __future__ import annotations

from dataclasses import dataclass

from hybridkv.connectors.stats import ConnectorStats, counter


@dataclass(slots=True)
class FileStats(ConnectorStats):
    """``FileConnector``'s own counters (both halves)."""

    load_requests: int = counter("load_requests")
    load_tokens: int = counter("load_tokens")
    load_blocks: int = counter("load_blocks")
    load_states: int = counter("load_states")
    files_removed: int = counter("files_removed")  # bad files deleted on load
    store_blocks: int = counter("store_blocks")
    store_states: int = counter("store_states")
    store_failures: int = counter("store_failures")
    late_loads_dropped: int = counter("late_loads_dropped")  # read after their timeout
