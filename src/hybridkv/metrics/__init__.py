"""The server's Prometheus metrics, all prefixed ``hybridkv:``: the one table of metrics
(``METRICS``), the per-server registry and the collector that turns the engine's latest
``EngineStats`` snapshot (``hybridkv.engine.stats``) into metric families (``prometheus.py``),
and the per-request histograms and counters observed from each ``RequestOutput``
(``requests.py``). See docs/metrics.md.
"""
