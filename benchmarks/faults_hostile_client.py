"""B5's hostile-client row: a prefill/decode pair (``hybridkv serve`` with NixlConnector, real
processes) behind ``hybridkv proxy``, serving honest streamed requests through the proxy while
an attacker sends the decode engine directly, at 10 % of the requests, one of:

    forged      genuine signed params of its own prompt with another user's block ids
    retargeted  genuine params sent with another (popular) prompt
    huge        ``num_tokens: 1e999`` or ``remote_port: 10**30``
    unknown     params naming an untrusted host (127.0.0.2) or the port of a listener that
                accepts and then drips one byte a second (a stalled side channel)

Rows: ``clean`` (honest requests alone) and ``hostile client`` (the same honest requests with
the attack mixed in), alternating after a warm-up, both engines' prefix caches reset before
each run. Reported: wrong tokens of honest requests against the producer's plain answers,
decode ``/health`` polls that were not 200, attacks answered 5xx, and honest TTFT p50/p90
with the ratio of the hostile run's p90 to the clean run's (target <= 1.5x)."""

from __future__ import annotations

import json
import socket
import statistics
import sys
import tempfile
import threading
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
ATTACK_EVERY = 9  # one attack per nine honest requests: 10 % of all requests
CONCURRENCY = 4


class DrippingListener:
    """A TCP listener on loopback that accepts and then sends one byte a second: what a stalled
    side channel looks like to a consumer that connects."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.stop = threading.Event()
        self.accepted = 0
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        self.sock.settimeout(0.2)
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self.accepted += 1
            threading.Thread(target=self._drip, args=(conn,), daemon=True).start()

    def _drip(self, conn: socket.socket) -> None:
        with conn:
            while not self.stop.wait(1.0):
                try:
                    conn.sendall(b"\x00")
                except OSError:
                    return

    def close(self) -> None:
        self.stop.set()
        self.sock.close()


def _body(prompt: list[int], max_tokens: int, **extra: Any) -> dict[str, Any]:
    return {"model": "m", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, **extra}


def _post(url: str, body: dict[str, Any] | str) -> httpx.Response:
    content = body if isinstance(body, str) else json.dumps(body)
    headers = {"content-type": "application/json"}
    return httpx.post(url + "/v1/completions", content=content, headers=headers, timeout=300)


def streamed(url: str, prompt: list[int], max_tokens: int) -> tuple[float, str]:
    """TTFT (first streamed chunk with text) and the whole text of one honest request."""
    start, first, text = time.perf_counter(), None, []
    body = _body(prompt, max_tokens, stream=True)
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=300) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            piece = json.loads(line[6:])["choices"][0]["text"]
            if piece and first is None:
                first = time.perf_counter() - start
            text.append(piece)
    return (first if first is not None else time.perf_counter() - start), "".join(text)


class Attacker:
    """Hostile requests for the decode engine, built from genuine params of its own prompts."""

    def __init__(self, prefill_url: str, decode_url: str, listener: DrippingListener) -> None:
        self.prefill_url, self.decode_url, self.listener = prefill_url, decode_url, listener
        self.kinds = ["forged", "retargeted", "huge_tokens", "huge_port", "untrusted", "stalled"]
        self.sent: dict[str, int] = {}
        self.server_errors = 0
        self.num_attacks = 0  # the kinds take turns over the whole benchmark

    def _params(self, prompt: list[int]) -> dict[str, Any]:
        r = _post(self.prefill_url, _body(prompt, 1, kv_transfer_params={"do_remote_decode": True}))
        return dict(r.json()["kv_transfer_params"])

    def attack(self, prompt: list[int], victim: list[int]) -> None:
        kind = self.kinds[self.num_attacks % len(self.kinds)]
        self.num_attacks += 1
        params = self._params(prompt)
        body: dict[str, Any] | str = _body(prompt, 4, kv_transfer_params=params)
        if kind == "forged":
            ids = [[b + 1 for b in t] for t in params.get("remote_block_ids", [])]
            body = _body(prompt, 4, kv_transfer_params={**params, "remote_block_ids": ids})
        elif kind == "retargeted":
            body = _body(victim, 4, kv_transfer_params=params)
        elif kind in ("huge_tokens", "huge_port"):
            field, value = ("num_tokens", "1e999") if kind == "huge_tokens" else ("remote_port", str(10**30))  # fmt: skip
            body = json.dumps(body).replace(f'"{field}": {json.dumps(params[field])}', f'"{field}": {value}')  # fmt: skip
        elif kind == "untrusted":
            body = _body(prompt, 4, kv_transfer_params={**params, "remote_host": "127.0.0.2"})
        else:
            port = self.listener.port
            body = _body(prompt, 4, kv_transfer_params={**params, "remote_port": port})
        status = _post(self.decode_url, body).status_code
        self.sent[kind] = self.sent.get(kind, 0) + 1
        self.server_errors += status >= 500


class HealthWatch:
    """Polls the decode engine's /health every 0.25 s; counts answers other than 200."""

    def __init__(self, url: str) -> None:
        self.url, self.polls, self.bad = url, 0, 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.wait(0.25):
            try:
                ok = httpx.get(self.url + "/health", timeout=5).status_code == 200
            except httpx.HTTPError:
                ok = False
            self.polls += 1
            self.bad += not ok

    def close(self) -> None:
        self.stop.set()
        self.thread.join()


def one_run(
    proxy: str, honest: list[list[int]], max_tokens: int, attacker: Attacker | None
) -> tuple[list[float], list[str]]:
    """Every honest prompt through the proxy (CONCURRENCY at a time); with an attacker, one
    attack after every ATTACK_EVERY honest requests are handed out."""
    ttfts: list[float] = [0.0] * len(honest)
    texts: list[str] = [""] * len(honest)
    lock, next_index = threading.Lock(), [0]

    def worker() -> None:
        while True:
            with lock:
                i = next_index[0]
                next_index[0] += 1
            if i >= len(honest):
                return
            ttfts[i], texts[i] = streamed(proxy, honest[i], max_tokens)
            if attacker is not None and i % ATTACK_EVERY == ATTACK_EVERY - 1:
                own = [t + 1 for t in honest[i]][:40]  # the attacker's own prompt
                attacker.attack(own, honest[0])

    threads = [threading.Thread(target=worker) for _ in range(CONCURRENCY)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return ttfts, texts


def _reset(*urls: str) -> None:
    """Both prefix caches dropped; an engine still releasing a transfer answers 409 (not
    idle), so each is retried for up to a minute."""
    for url in urls:
        deadline = time.monotonic() + 60
        while (r := httpx.post(url + "/reset_prefix_cache", timeout=60)).status_code == 409:
            if time.monotonic() > deadline:
                r.raise_for_status()
            time.sleep(0.2)
        r.raise_for_status()


def _p(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def bench_hostile_client(
    model: Path, prompts: list[list[int]], output_len: int, rounds: int
) -> dict[str, Any]:
    """Rows ``clean`` and ``hostile client`` (see the module docstring)."""
    sys.path.insert(0, str(ROOT))
    from tests.e2e_pd.harness import ProxyProcess, engine

    with ExitStack() as stack, tempfile.TemporaryDirectory(prefix="hybridkv-b5-client-") as tmp:
        logs = Path(tmp)
        # NOTE: the attacker's own genuine params are never read (its requests are refused),
        # so the producer holds that KV until abort_timeout_seconds: short here, so that the
        # resets between runs need not wait two minutes
        p = stack.enter_context(
            engine(model, logs / "p.log", "kv_producer", abort_timeout_seconds=10)
        )
        d = stack.enter_context(engine(model, logs / "d.log", "kv_consumer"))
        proxy = stack.enter_context(ProxyProcess([p.url], [d.url], logs / "proxy.log"))
        listener = DrippingListener()
        stack.callback(listener.close)
        want = [_post(p.url, _body(pr, output_len)).json()["choices"][0]["text"] for pr in prompts]
        attacker = Attacker(p.url, d.url, listener)
        runs: dict[str, list[list[float]]] = {"clean": [], "hostile client": []}
        wrong = {name: 0 for name in runs}
        watch = HealthWatch(d.url)
        for r in range(rounds + 1):  # round 0 warms up
            for name in runs:
                _reset(p.url, d.url)
                ttfts, texts = one_run(proxy.url, prompts, output_len, attacker if name != "clean" else None)  # fmt: skip
                if r:
                    runs[name].append(ttfts)
                    wrong[name] += sum(got != w for got, w in zip(texts, want, strict=True))
        watch.close()
    rows = {}
    for name, per_run in runs.items():
        flat = [t for run in per_run for t in run]
        rows[name] = {
            "ttft_p50_ms": round(statistics.median(flat) * 1e3, 1),
            "ttft_p90_ms": round(_p(flat, 0.9) * 1e3, 1),
            "wrong_requests": wrong[name],
        }
    ratio = rows["hostile client"]["ttft_p90_ms"] / rows["clean"]["ttft_p90_ms"]
    rows["hostile client"]["ttft_p90_vs_clean"] = round(ratio, 2)
    return {
        "rows": rows,
        "attacks": attacker.sent,
        "attacks_answered_5xx": attacker.server_errors,
        "stalled_listener_connections": listener.accepted,
        "decode_health_polls": watch.polls,
        "decode_health_not_200": watch.bad,
    }
