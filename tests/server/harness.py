"""Starting servers for tests: in a thread (fake engine) or as a subprocess (real model);
both come from ``tests/support/served.py``."""

from __future__ import annotations

import sys
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.support.ports import free_port
from tests.support.served import ServedProcess, ThreadedServer
from tests.support.waits import wait_for

__all__ = ["ThreadedServer", "free_port", "wait_for"]  # tests import them from here


class SubprocessServer(ServedProcess):
    """``python -m hybridkv serve ARGS`` on a free port; waits for /health."""

    def __init__(self, args: list[str], log_path: Path, timeout: float = 300.0) -> None:
        cmd = [sys.executable, "-m", "hybridkv", "serve", "--uvicorn-log-level", "warning"]
        super().__init__([*cmd, *args], log_path, timeout)


def scrape(url: str) -> dict[str, float]:
    """/metrics as {'name{label=value,...}': value} (parsed by prometheus_client); the
    ``model_name`` label every sample carries is left out."""
    return parse_metrics(httpx.get(url + "/metrics", timeout=10).text)


def parse_metrics(text: str) -> dict[str, float]:
    values = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            named = {k: v for k, v in s.labels.items() if k != "model_name"}
            labels = ",".join(f"{k}={v}" for k, v in sorted(named.items()))
            values[f"{s.name}{{{labels}}}" if labels else s.name] = s.value
    return values
