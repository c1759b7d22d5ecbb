"""Run a benchmark script's ``--quick`` mode in a subprocess and return its JSON report."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


def run_quick(script: str, *args: str, timeout: float = 300) -> dict[str, Any]:
    res = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / script), "--quick", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=timeout,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    out: dict[str, Any] = json.loads(res.stdout)
    assert {"cores", "python", "torch", "threads"} <= out["machine"].keys()
    return out
