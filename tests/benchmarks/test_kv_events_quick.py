"""benchmarks/kv_events_overhead.py --quick runs every mode and the ZMQ subscriber receives
every published batch (it checks the script works, not how fast anything is)."""

from __future__ import annotations

from pathlib import Path

from tests.benchmarks.quick import run_quick
from tests.support.cache_dirs import private_cache


def test_kv_events_overhead_quick(tmp_path: Path) -> None:
    cache = private_cache(tmp_path / "cache")  # its own default model, the shared kernels
    out = run_quick("kv_events_overhead.py", "--cache-dir", str(cache), timeout=600)
    assert out["benchmark"] == "kv_events_overhead" and out["quick"] is True
    results = out["results"]
    assert set(results) == {"off", "null", "zmq"}
    for mode in ("null", "zmq"):
        (run,) = results[mode]["runs"]
        assert run["batches"] > 0 and run["dropped"] == 0
    (zmq_run,) = results["zmq"]["runs"]
    assert 0 < zmq_run["received"] <= zmq_run["batches"]  # a PUB drops before a SUB joins
