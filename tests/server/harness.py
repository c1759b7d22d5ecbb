"""Starting servers for tests: in a thread (fake engine) or as a subprocess (real model)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.support.ports import free_port
from tests.support.waits import wait_for

__all__ = ["free_port", "wait_for"]  # tests import them from here


class ThreadedServer:
    """uvicorn serving ``app`` on a free port in a background thread."""

    def __init__(self, app: Any, **config_kw: Any) -> None:
        import uvicorn

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(
            app, host="127.0.0.1", port=self.port, log_level="warning", **config_kw
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> ThreadedServer:
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            assert time.monotonic() < deadline, "the test server did not start"
            time.sleep(0.02)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(10)


class SubprocessServer:
    """``python -m hybridkv serve ARGS`` on a free port; waits for /health."""

    def __init__(self, args: list[str], log_path: Path, timeout: float = 300.0) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.args = args
        self.log_path = log_path
        self.timeout = timeout
        self.proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> SubprocessServer:
        cmd = [sys.executable, "-m", "hybridkv", "serve", "--port", str(self.port)]
        cmd += ["--uvicorn-log-level", "warning", *self.args]
        self._log = open(self.log_path, "wb")  # noqa: SIM115
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT, env=env)
        deadline = time.monotonic() + self.timeout
        while not self._healthy():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.__exit__()
                raise RuntimeError(f"server did not come up; its log:\n{self.log()}")
            time.sleep(0.25)
        return self

    def _healthy(self) -> bool:
        try:
            return httpx.get(self.url + "/health", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()


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
