"""``NixlStats``: the NixlConnector's counters, by meaning (``metrics.nixl_families`` shows them
with ``connector="NixlConnector"``)."""

from __future__ import annotations

from dataclasses import dataclass

from hybridkv.choice import Choice
from hybridkv.connectors.stats import ConnectorStats, counter


class Flow(Choice):
    LOAD = "load"  # read here, from a producer
    SEND = "send"  # read from here by a consumer


@dataclass(slots=True)
class NixlStats(ConnectorStats):
    nbytes: dict[Flow, int] = counter("nixl_bytes.{}")
    seconds: dict[Flow, float] = counter("nixl_seconds.{}")  # a load's start to its data landing
    transfers: dict[Flow, int] = counter("nixl_transfers.{}")
    descriptors: int = counter("nixl_descriptors")  # posted, after merging runs
    handshakes: int = counter("nixl_handshakes")
    handshake_failures: int = counter("nixl_handshake_failures")
    failures: dict[str, int] = counter("nixl_failures.{}")  # by the reason the load reports
    leases_expired: int = counter("nixl_leases_expired")
    notifications_unmatched: int = counter("nixl_notifications_unmatched")
    heartbeats_sent: int = counter("nixl_heartbeats_sent")  # consumer: request ids sent
    heartbeats_received: int = counter("nixl_heartbeats_received")  # producer: ids received
    heartbeats_unmatched: int = counter("nixl_heartbeats_unmatched")  # of those: no lease held
