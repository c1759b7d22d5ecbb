"""The two servers ``llamacpp_mixed.py`` puts behind one client: ``hybridkv serve FILE`` and
llama.cpp's ``llama-server -m FILE``, each a subprocess on a free loopback port, its log in a
temporary file (printed if it fails to come up), stopped on exit whatever happens.

Requests go as token ids, greedy, EOS ignored, no prompt cache: hybridkv's OpenAI
``/v1/completions`` (``return_token_ids``), llama-server's native ``/completion``
(``return_tokens``).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

START_TIMEOUT_S = 300.0
REQUEST_TIMEOUT_S = 1800.0


@dataclass(frozen=True)
class Server:
    name: str
    url: str

    def complete(self, prompt: list[int], max_tokens: int) -> list[int]:
        """Greedy output token ids of one request (``max_tokens`` of them: EOS ignored)."""
        if self.name == "hybridkv":
            body = {"model": "m", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0,
                    "ignore_eos": True, "return_token_ids": True}  # fmt: skip
            tokens = _post(f"{self.url}/v1/completions", body)["choices"][0]["token_ids"]
        else:
            body = {"prompt": prompt, "n_predict": max_tokens, "temperature": 0.0, "top_k": 1,
                    "ignore_eos": True, "cache_prompt": False, "return_tokens": True}  # fmt: skip
            tokens = _post(f"{self.url}/completion", body)["tokens"]
        if len(tokens) != max_tokens:
            raise RuntimeError(f"{self.name}: {len(tokens)} tokens, asked for {max_tokens}")
        return [int(t) for t in tokens]


def _post(url: str, body: dict[str, Any]) -> Any:
    req = urllib.request.Request(
        url, json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=REQUEST_TIMEOUT_S) as resp:
        return json.loads(resp.read())


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def _process(name: str, cmd: list[str], port: int, env: dict[str, str]) -> Iterator[Server]:
    with tempfile.TemporaryFile("w+") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
        try:
            server = Server(name, f"http://127.0.0.1:{port}")
            _wait_healthy(server, proc, log)
            yield server
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _wait_healthy(server: Server, proc: subprocess.Popen[bytes], log: Any) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            break
        try:
            with urllib.request.urlopen(f"{server.url}/health", timeout=5) as resp:
                if resp.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.5)
    log.seek(0)
    print(log.read()[-4000:], file=sys.stderr)
    raise RuntimeError(f"{server.name} did not come up (exit code {proc.poll()})")


@contextmanager
def hybridkv_server(
    path: Path, threads: int, max_seqs: int, ctx: int, src: Path | None = None
) -> Iterator[Server]:
    """``src``: run hybridkv from that source tree (a baseline) instead of the installed one."""
    port = _free_port()
    cmd = [sys.executable, "-m", "hybridkv", "serve", str(path), "--port", str(port),
           "--served-model-name", "m", "--max-num-seqs", str(max_seqs),
           "--max-model-len", str(ctx), "--max-num-batched-tokens", "2048",
           "--kv-cache-memory", "768MiB", "--no-enable-prefix-caching",
           "--disable-log-requests", "--uvicorn-log-level", "warning"]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    if src is not None:
        env["PYTHONPATH"] = str(src)
    with _process("hybridkv", cmd, port, env) as server:
        yield server


@contextmanager
def llama_server(bin_dir: Path, path: Path, threads: int, slots: int, ctx: int) -> Iterator[Server]:
    """``slots`` parallel sequences, each with ``ctx`` tokens of context."""
    port = _free_port()
    # -nr: no weight repacking (with it this build stops with SIGILL at start on this machine)
    cmd = [str(bin_dir / "llama-server"), "-m", str(path), "--host", "127.0.0.1",
           "--port", str(port), "-np", str(slots), "-c", str(slots * ctx), "-t", str(threads),
           "-tb", str(threads), "-b", "2048", "-ub", "512", "--no-webui",
           "-nr"]  # fmt: skip
    with _process("llama.cpp", cmd, port, dict(os.environ)) as server:
        yield server
