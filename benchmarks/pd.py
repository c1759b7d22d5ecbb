"""B6: prefill/decode transfer over NIXL.

    .venv/bin/python benchmarks/pd.py            # full run (a few minutes, 2 cores)
    .venv/bin/python benchmarks/pd.py --quick    # seconds: checks the script runs

Prints one JSON document with three parts:
- ``bytes``: bytes per request a NixlConnector transfer moves (clipped: full groups every
  token, sliding groups the window's blocks, one state checkpoint) against every prompt block
  of every group (unclipped), by layout ("small" checkpoints of each family) and prompt length.
  Computed from the layout with the connector's own plan; the tests check real transfers count
  exactly these bytes (tests/connectors/nixl/test_pair.py).
- ``throughput``: NIXL READ between two processes (a producer process registers a buffer and
  serves its metadata on the side channel, this process reads) against a plain copy of the
  same bytes between the same two processes through shared memory; medians (min, max) over
  --repeats, alternating. ``blocked`` reads the same bytes as 16 KiB descriptors.
- ``ttft_ms``: time to first token of a disaggregated request (prefill engine, then the
  decode engine's read and last-token step) vs a colocated engine, two engines in this process.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from multiprocessing import resource_tracker, shared_memory
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bench_common import machine_info

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT))

from hybridkv.connectors.nixl.agent import NixlAgent, XferState  # noqa: E402
from hybridkv.connectors.nixl.layout import LayoutDescriptor, group_descs  # noqa: E402
from hybridkv.connectors.nixl.plan import (  # noqa: E402
    consumer_range,
    producer_first_block,
    transfer_end,
)
from hybridkv.connectors.nixl.side_channel import SideChannelServer, fetch  # noqa: E402
from hybridkv.kv.spec import KVCacheLayout, create_layout  # noqa: E402

BLOCK_DESC = 16 << 10


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# -- bytes -------------------------------------------------------------------------------------


def layout_of(arch: str, size: str) -> KVCacheLayout:
    from hybridkv.model.config import build_model_config
    from hybridkv.model.make_model import model_config_json

    raw = model_config_json(arch, size)
    config = build_model_config(raw["architectures"][0], raw, ())
    return create_layout(config.layer_specs(16, "bfloat16"), 16)


def clipped_bytes(layout: KVCacheLayout, n: int) -> int:
    groups = group_descs(layout)
    end = transfer_end(n, layout.block_size, bool(layout.state_group_ids))
    total = layout.total_state_slot_bytes() if end else 0
    for g in groups:
        if g.token_bytes:
            first = producer_first_block(g, end, layout.block_size) * layout.block_size
            lo, hi = consumer_range(g, 0, end, layout.block_size, first)
            total += (hi - lo) * 2 * g.token_bytes * g.num_layers
    return total


def bytes_table(lengths: list[int]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for arch in ("qwen3", "gemma3", "granitemoehybrid"):
        layout = layout_of(arch, "small")
        rows = {}
        for n in lengths:
            unclipped = len(layout.attention_group_ids) * -(-n // 16) * layout.page_bytes
            unclipped += layout.total_state_slot_bytes()
            clipped = clipped_bytes(layout, n)
            rows[str(n)] = {"clipped": clipped, "unclipped": unclipped, "ratio": round(unclipped / max(clipped, 1), 2)}  # fmt: skip
        out[arch] = {"layout": layout.describe().splitlines()[0], "by_prompt_tokens": rows}
    return out


# -- throughput --------------------------------------------------------------------------------


def serve_producer(port: int, nbytes: int, shm_name: str) -> None:
    """The producer process: a registered buffer (and the shared-memory twin of the baseline)
    filled with a pattern; serves its descriptor until stdin closes."""
    buf = torch.arange(nbytes, dtype=torch.int64).to(torch.uint8)
    shm = shared_memory.SharedMemory(name=shm_name)
    resource_tracker.unregister(shm._name, "shared_memory")  # the parent owns (unlinks) it
    np.copyto(np.ndarray((nbytes,), np.uint8, shm.buf), buf.numpy())
    agent = NixlAgent("bench-producer")
    agent.register([(buf.data_ptr(), nbytes)])
    desc = LayoutDescriptor(
        "bench-producer", "", 0, 0, (buf.data_ptr(),), (), (), 0, 0, agent.metadata()
    )
    server = SideChannelServer("127.0.0.1", port, desc.encode())
    print("ready", flush=True)
    sys.stdin.read()
    server.close()
    shm.close()


def timed_read(agent: NixlAgent, peer: str, descs: list[tuple[int, int, int]]) -> float:
    t0 = time.perf_counter()
    handle = agent.read(peer, descs, b"")
    state = agent.state(handle)
    while state is XferState.PROC:
        state = agent.state(handle)
    agent.release(handle)
    if state is not XferState.DONE:
        raise RuntimeError("NIXL read failed")
    return time.perf_counter() - t0


def throughput(sizes: list[int], repeats: int) -> dict[str, Any]:
    top = max(sizes)
    shm = shared_memory.SharedMemory(create=True, size=top)
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, __file__, "--serve-producer", str(port), str(top), shm.name],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        for line in proc.stdout:  # NIXL logs to stdout too
            if line.strip() == "ready":
                break
        else:
            raise RuntimeError("the producer process did not start")
        remote = LayoutDescriptor.decode(fetch("127.0.0.1", port, 10.0))
        local = torch.zeros(top, dtype=torch.uint8)
        agent = NixlAgent("bench-consumer")
        agent.register([(local.data_ptr(), top)])
        peer = agent.add_remote(remote.agent_metadata)
        src, dst = np.ndarray((top,), np.uint8, shm.buf), local.numpy()
        out = {}
        for size in sizes:
            whole = [(local.data_ptr(), remote.backing[0], size)]
            step = min(BLOCK_DESC, size)
            blocked = [
                (local.data_ptr() + o, remote.backing[0] + o, step) for o in range(0, size, step)
            ]
            timed_read(agent, peer, whole)  # warm-up (connection, registration caches)
            runs: dict[str, list[float]] = {"nixl": [], "nixl_blocked": [], "shm_copy": []}
            for _ in range(repeats):
                runs["nixl"].append(size / timed_read(agent, peer, whole) / 1e9)
                runs["nixl_blocked"].append(size / timed_read(agent, peer, blocked) / 1e9)
                t0 = time.perf_counter()
                np.copyto(dst[:size], src[:size])
                runs["shm_copy"].append(size / (time.perf_counter() - t0) / 1e9)
            assert np.array_equal(dst[:size], src[:size])
            row = {k: _summary(v) for k, v in runs.items()}
            row["nixl_vs_copy"] = round(row["nixl"]["median"] / row["shm_copy"]["median"], 3)
            out[str(size)] = row
            log(f"throughput {size}: {row}")
        return {"gbps": out, "blocked_descriptor_bytes": BLOCK_DESC}
    finally:
        if proc.stdin is not None:
            proc.stdin.close()
        proc.wait(30)
        shm.close()
        shm.unlink()


def _summary(values: list[float]) -> dict[str, float]:
    return {"median": round(statistics.median(values), 3), "min": round(min(values), 3), "max": round(max(values), 3)}  # fmt: skip


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# -- TTFT --------------------------------------------------------------------------------------


def ttft(lengths: list[int], repeats: int) -> dict[str, Any]:
    from tests.connectors.nixl.pair import consumer, greedy, producer, run
    from tests.engine.helpers import make_engine, random_ids

    from hybridkv.model.make_model import make_model

    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        model = make_model("granitemoehybrid", Path(tmp) / "m", size="tiny")
        plain, p, d = make_engine(model), producer(model), consumer(model)
        try:
            run(d, random_ids(40, 0), greedy(params=run(p, random_ids(40, 0), greedy(1, {"do_remote_decode": True})).kv_transfer_params), p)  # fmt: skip
            for n in lengths:
                rows: dict[str, list[float]] = {"colocated": [], "disaggregated": []}
                for r in range(repeats):
                    prompt = random_ids(n, 1000 * n + r)  # new each time: no prefix hits
                    t0 = time.perf_counter()
                    run(plain, prompt, greedy(1))
                    rows["colocated"].append((time.perf_counter() - t0) * 1e3)
                    prompt = random_ids(n, 2000 * n + r)
                    t0 = time.perf_counter()
                    pre = run(p, prompt, greedy(1, {"do_remote_decode": True}))
                    run(d, prompt, greedy(1, pre.kv_transfer_params), p)
                    rows["disaggregated"].append((time.perf_counter() - t0) * 1e3)
                out[str(n)] = {k: _summary(v) for k, v in rows.items()}
                log(f"ttft {n}: {out[str(n)]}")
        finally:
            p.shutdown()
            d.shutdown()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes: checks the script runs")
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument(
        "--serve-producer", nargs=3, metavar=("PORT", "BYTES", "SHM"), help=argparse.SUPPRESS
    )
    args = parser.parse_args()
    if args.serve_producer:
        port, nbytes, name = args.serve_producer
        serve_producer(int(port), int(nbytes), name)
        return
    repeats = args.repeats or (2 if args.quick else 7)
    lengths = [256, 1024] if args.quick else [256, 1024, 4096, 16384]
    sizes = [1 << 20] if args.quick else [64 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20]
    result = {
        "benchmark": "pd",
        "machine": machine_info(),
        "bytes": bytes_table(lengths),
        "throughput": throughput(sizes, repeats),
        "ttft_ms": ttft([64] if args.quick else [256, 1024, 2048], 1 if args.quick else repeats),
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
