"""benchmarks/offload.py --quick runs (it checks the script works, not how fast)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_offload_quick() -> None:
    res = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "offload.py"), "--quick"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    out = json.loads(res.stdout)
    assert out["benchmark"] == "offload" and {"cores", "torch"} <= out["machine"].keys()
    assert out["cpu_tier"]["load_gbps"]["median"] > 0 and out["cpu_tier"]["copy_gbps"]["median"] > 0
    for cache in ("warm", "cold"):
        assert out["disk_tier"][cache]["load_gbps"]["median"] > 0
    for n in ("128", "256"):
        assert set(out["ttft_ms"][n]) == {"recompute", "cpu", "disk"}
