"""Servers for tests: ``ServedProcess`` runs a command that serves HTTP on a free loopback
port (``python -m hybridkv serve`` or ``proxy``) until its ``/health`` answers, and stops it
on exit, failed test or not; ``ThreadedServer`` runs an ASGI app in a thread."""

from __future__ import annotations

import os
import subprocess
import threading
from collections.abc import Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import Any, Self

import httpx

from tests.support.ports import free_port
from tests.support.process import die_with_parent
from tests.support.waits import wait_for


class ServedProcess:
    """``[*cmd, "--port", PORT]`` with its output in ``log_path``; ``__enter__`` returns once
    ``/health`` says 200 (RuntimeError with the log if the process exits or ``timeout``
    seconds pass first)."""

    def __init__(self, cmd: list[str], log_path: Path, timeout: float = 300.0) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.cmd = [*cmd, "--port", str(self.port)]
        self.log_path = log_path
        self.timeout = timeout
        self.proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> Self:
        self.start()
        return self.wait_ready()

    def start(self) -> None:
        """Start the process without waiting for it (``serve_all`` starts several at once)."""
        self._log = open(self.log_path, "wb")  # noqa: SIM115
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        self.proc = subprocess.Popen(
            self.cmd, stdout=self._log, stderr=subprocess.STDOUT, env=env,
            preexec_fn=die_with_parent,
        )  # fmt: skip

    def wait_ready(self) -> Self:
        """Wait for ``/health``; the process is stopped and its log raised if it never comes."""
        proc = self.proc
        assert proc is not None, "start() first"
        try:
            wait_for(lambda: proc.poll() is not None or self._healthy(), self.timeout,
                     what=f"{self.url}/health", every=0.1)  # fmt: skip
        except AssertionError:
            proc.kill()
            proc.wait()
        if proc.poll() is not None:
            self.__exit__()
            raise RuntimeError(f"{self.cmd[:4]} did not come up; its log:\n{self.log()}")
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


def serve_all(stack: ExitStack, servers: Sequence[ServedProcess]) -> None:
    """Start every server, then wait for each: they come up side by side, not one after the
    other. Each is stopped when ``stack`` closes (also when one of them fails to come up)."""
    for server in servers:
        server.start()
        stack.callback(server.__exit__)
    for server in servers:
        server.wait_ready()


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
        wait_for(lambda: self.server.started, 20, what="the test server to start")
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(10)
