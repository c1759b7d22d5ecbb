"""Prometheus families of the NixlConnector's counters (label ``connector="NixlConnector"``).

Counter names the halves write: ``nixl_bytes.<load|send>``, ``nixl_seconds.load``,
``nixl_transfers.<load|send>``, ``nixl_descriptors``, ``nixl_handshakes``,
``nixl_handshake_failures``, ``nixl_failures.<reason>``, ``nixl_leases_expired``,
``nixl_heartbeats_sent``, ``nixl_heartbeats_received``, ``nixl_heartbeats_unmatched``."""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from prometheus_client.core import CounterMetricFamily

CONNECTOR = "NixlConnector"


def nixl_families(counters: Mapping[str, float], prefix: str) -> Iterator[CounterMetricFamily]:
    if not any(name.startswith("nixl_") for name in counters):
        return

    def family(name: str, doc: str, *labels: str) -> CounterMetricFamily:
        return CounterMetricFamily(prefix + name, doc, labels=["connector", *labels])

    by_dir = {
        "kv_transfer_bytes": ("bytes moved by P/D transfers (load: read here; send: read from here)", "nixl_bytes"),
        "kv_transfer_seconds": ("seconds from a load's start to its data landing", "nixl_seconds"),
        "kv_transfer_requests": ("requests whose KV was transferred", "nixl_transfers"),
    }  # fmt: skip
    for metric, (doc, head) in by_dir.items():
        f = family(metric, doc, "direction")
        for name, value in sorted(counters.items()):
            if name.startswith(head + "."):
                f.add_metric([CONNECTOR, name.partition(".")[2]], value)
        yield f
    simple = {
        "kv_transfer_descriptors": ("NIXL descriptors posted (after merging runs)", "nixl_descriptors"),
        "kv_transfer_handshakes": ("handshakes completed with producers", "nixl_handshakes"),
        "kv_transfer_leases_expired": ("producer KV freed unread after abort_timeout_seconds", "nixl_leases_expired"),
        "kv_transfer_heartbeats_sent": ("request ids in lease heartbeats sent to producers", "nixl_heartbeats_sent"),
        "kv_transfer_heartbeats_received": ("request ids in lease heartbeats received from consumers", "nixl_heartbeats_received"),
        "kv_transfer_heartbeats_unmatched": ("received heartbeat ids with no lease held (unknown or ended)", "nixl_heartbeats_unmatched"),
    }  # fmt: skip
    for metric, (doc, name) in simple.items():
        f = family(metric, doc)
        f.add_metric([CONNECTOR], counters.get(name, 0.0))
        yield f
    failures = family("kv_transfer_failures", "failed transfers, by reason", "reason")
    for name, value in sorted(counters.items()):
        if name.startswith("nixl_failures."):
            failures.add_metric([CONNECTOR, name.partition(".")[2]], value)
    yield failures
