"""benchmarks/offload.py --quick runs (it checks the script works, not how fast)."""

from __future__ import annotations

from tests.benchmarks.quick import run_quick


def test_offload_quick() -> None:
    out = run_quick("offload.py")
    assert out["benchmark"] == "offload" and {"cores", "torch"} <= out["machine"].keys()
    for phase in ("fill", "steady", "fill_prealloc"):
        cpu = out["cpu_tier"][phase]
        assert cpu["load_gbps"]["median"] > 0 and cpu["copy_gbps"]["median"] > 0
        assert cpu["store_gbps"]["median"] > 0
    for cache in ("warm", "cold"):
        assert out["disk_tier"][cache]["load_gbps"]["median"] > 0
    for n in ("128", "256"):
        assert set(out["ttft_ms"][n]) == {"recompute", "cpu", "disk", "remote"}
    remote = out["remote_tier"]
    assert remote["load_gbps"]["median"] > 0 and remote["plain_get_gbps"]["median"] > 0
    assert remote["store_gbps"]["median"] > 0 and remote["plain_set_gbps"]["median"] > 0
