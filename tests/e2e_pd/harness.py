"""Disaggregated deployments for tests: prefill and decode engines (``hybridkv serve`` with
NixlConnector) and a ``hybridkv proxy``, all on free loopback ports, all stopped on exit."""

from __future__ import annotations

import json
import sys
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from tests.server.harness import SubprocessServer, free_port
from tests.support.served import ServedProcess, serve_all

ENGINE_FLAGS = [
    "--served-model-name",
    "m",
    "--dtype",
    "float32",
    "--kv-cache-memory",
    "64MiB",
    "--max-num-seqs",
    "8",
]


def nixl_config(role: str, port: int | None = None, policy: str | None = None, **extra: Any) -> str:
    options: dict[str, Any] = dict(extra)
    if port is not None:
        options["side_channel_port"] = port
    config: dict[str, Any] = {"kv_connector": "NixlConnector", "kv_role": role}
    if policy is not None:
        config["kv_load_failure_policy"] = policy
    if options:
        config["kv_connector_extra_config"] = options
    return json.dumps(config)


def engine(
    model: Path, log: Path, role: str | None, *flags: str, policy: str | None = None, **extra: Any
) -> SubprocessServer:
    """A server; ``role`` None serves colocated (no connector). Producers get a free
    side-channel port."""
    args = ["--model", str(model), *ENGINE_FLAGS, *flags]
    if role is not None:
        port = free_port() if role != "kv_consumer" else None
        args += ["--kv-transfer-config", nixl_config(role, port, policy, **extra)]
    return SubprocessServer(args, log)


class ProxyProcess(ServedProcess):
    """``python -m hybridkv proxy`` on a free port; waits for /health."""

    def __init__(self, prefill: list[str], decode: list[str], log: Path) -> None:
        cmd = [sys.executable, "-m", "hybridkv", "proxy", "--prefill", *prefill]
        super().__init__([*cmd, "--decode", *decode], log, timeout=60)


@dataclass
class Deployment:
    prefill: list[SubprocessServer]
    decode: list[SubprocessServer]
    proxy: ProxyProcess
    stack: ExitStack = field(default_factory=ExitStack)


def deploy(
    model: Path, logs: Path, num_prefill: int, num_decode: int, p_flags: tuple[str, ...] = (),
    d_flags: tuple[str, ...] = (), **extra: Any,
) -> Deployment:  # fmt: skip
    """Start everything (engines side by side); on any failure what started is stopped."""
    stack = ExitStack()
    try:
        servers = [engine(model, logs / f"p{i}.log", "kv_producer", *p_flags, **extra) for i in range(num_prefill)]  # fmt: skip
        servers += [engine(model, logs / f"d{i}.log", "kv_consumer", *d_flags) for i in range(num_decode)]  # fmt: skip
        serve_all(stack, servers)
        prefill, decode = servers[:num_prefill], servers[num_prefill:]
        proxy = stack.enter_context(
            ProxyProcess([s.url for s in prefill], [s.url for s in decode], logs / "proxy.log")
        )
    except BaseException:
        stack.close()
        raise
    return Deployment(prefill, decode, proxy, stack)


def complete(url: str, prompt: list[int], max_tokens: int, **body: Any) -> dict[str, Any]:
    r = httpx.post(
        url + "/v1/completions",
        json={"model": "m", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, **body},
        timeout=300,
    )
    assert r.status_code == 200, r.text
    return dict(r.json())


def stream_tokens_text(
    url: str, prompt: list[int], max_tokens: int
) -> tuple[str, list[dict[str, Any]]]:
    """A streamed completion's text and its events."""
    body = {"model": "m", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True}  # fmt: skip
    r = httpx.post(url + "/v1/completions", json=body, timeout=300)
    assert r.status_code == 200, r.text
    events = [json.loads(x[6:]) for x in r.text.split("\n\n") if x.startswith("data: {")]
    return "".join(e["choices"][0]["text"] for e in events if e.get("choices")), events
