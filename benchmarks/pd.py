"""B6: prefill/decode transfer over NIXL.

    .venv/bin/python benchmarks/pd.py                       # full run (minutes, 2 cores)
    .venv/bin/python benchmarks/pd.py --throughput-only     # B6 transfer part only
    .venv/bin/python benchmarks/pd.py --quick               # seconds: checks the script runs

Prints one JSON document with three parts:
- ``bytes``: bytes per request a NixlConnector transfer moves (clipped: full groups every
  token, sliding groups the window's blocks, one state checkpoint) against every prompt block
  of every group (unclipped), by layout ("small" checkpoints of each family) and prompt length.
  Computed from the layout with the connector's own plan; the tests check real transfers count
  exactly these bytes (tests/connectors/nixl/test_pair.py).
- ``throughput``: loads through the NixlConnector's own read path (``pd_transfer.py``: a
  producer process serves a registered cache on the side channel, this process's ``Reader``
  plans, reads, checks the lease and notifies) against a plain copy of the same bytes between
  the same two processes through shared memory and against ``process_vm_readv`` (what UCX's
  same-host transport calls); wall and CPU time, medians over --repeats, alternating.
- ``floor``: the same sizes through bare NIXL (``pd_floor.py``: two agents, prepared lists, one
  READ, the lease-word READ, ``send_notif``; no hybridkv code) in the same run, with
  ``load_vs_floor`` per size: how far the product path is from the wire work itself.
- ``ttft_ms``: time to first token of a disaggregated request (prefill engine, then the
  decode engine's read and last-token step) vs a colocated engine, two engines in this process.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench_common import machine_info

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT))

from hybridkv.connectors.nixl.layout import group_descs  # noqa: E402
from hybridkv.connectors.nixl.plan import (  # noqa: E402
    consumer_range,
    producer_first_block,
    transfer_end,
)
from hybridkv.kv.spec import KVCacheLayout, create_layout  # noqa: E402
from pd_floor import measure as measure_floor  # noqa: E402
from pd_transfer import serve_producer, throughput  # noqa: E402


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# -- bytes -------------------------------------------------------------------------------------


def layout_of(arch: str, size: str) -> KVCacheLayout:
    from hybridkv.model.config.model_config import build_model_config
    from hybridkv.model.loading.make_model import model_config_json

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


def _summary(values: list[float]) -> dict[str, float]:
    return {"median": round(statistics.median(values), 3), "min": round(min(values), 3), "max": round(max(values), 3)}  # fmt: skip


def cpu_flags() -> list[str]:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("flags"):
            return sorted(f for f in line.split() if f.startswith(("avx", "amx", "fma")))
    return []


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# -- TTFT --------------------------------------------------------------------------------------


def ttft(lengths: list[int], repeats: int) -> dict[str, Any]:
    from tests.connectors.nixl.pair import consumer, greedy, producer, run
    from tests.engine.helpers import make_engine, random_ids

    from hybridkv.model.loading.make_model import make_model

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


ERROR_MODE_ENV = "HYBRIDKV_NIXL_UCX_ERROR_MODE"


def floor(sizes: list[int], repeats: int, loads: dict[str, Any]) -> dict[str, Any]:
    """The bare-NIXL floor (huge pages, as ``CacheTensors`` allocates; the UCX error mode
    the connector's agents use) beside the loads."""
    import pd_floor

    mode = os.environ.get(ERROR_MODE_ENV, "")
    params = [f"ucx_error_handling_mode={mode}"] if mode else []
    pd_floor.UCX_PARAMS.clear()
    pd_floor.UCX_PARAMS.update(kv.split("=", 1) for kv in params)
    args = argparse.Namespace(sizes=sizes, repeats=repeats, hugepages=True, delay_us=100, consumer_thread=False, busy_poll=False, ucx_param=params)  # fmt: skip
    out = measure_floor(args)
    for size, row in out["by_bytes"].items():
        if size in loads:  # the load moves whole tokens: compare per byte
            per_byte = row["us"]["floor"] / int(size)
            row["load_vs_floor"] = round(per_byte * loads[size]["bytes"] / loads[size]["us"]["load"], 3)  # fmt: skip
    return out


def b6(sizes: list[int], repeats: int, with_floor: bool, mode: str | None) -> dict[str, Any]:
    """B6's transfers (and the floor) under UCX error mode ``mode`` (None: the environment's)."""
    if mode is not None:
        os.environ[ERROR_MODE_ENV] = mode
    out: dict[str, Any] = {"ucx_error_mode": os.environ.get(ERROR_MODE_ENV) or "peer (NIXL default)", "load_average": os.getloadavg()}  # fmt: skip
    out["throughput"] = throughput(sizes, repeats, __file__, _free_port())
    if with_floor:
        out["floor"] = floor(sizes, repeats, out["throughput"])
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes: checks the script runs")
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--throughput-only", action="store_true", help="only the B6 transfer part")
    parser.add_argument("--sizes", type=int, nargs="+", help="transfer sizes in bytes")
    parser.add_argument("--no-floor", action="store_true", help="skip the bare-NIXL floor")
    parser.add_argument(
        "--ucx-error-modes",
        nargs="+",
        choices=("peer", "none"),
        help=f"B6 once per mode, in this order (sets {ERROR_MODE_ENV}; repeat to alternate)",
    )
    parser.add_argument(
        "--serve-producer", nargs=3, metavar=("PORT", "BYTES", "SHM"), help=argparse.SUPPRESS
    )
    args = parser.parse_args()
    if args.serve_producer:
        port, nbytes, name = args.serve_producer
        serve_producer(int(port), int(nbytes), name)
        return
    sizes = (
        [1 << 20]
        if args.quick
        else [4 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20]
    )
    sizes = args.sizes or sizes
    if args.throughput_only:
        result = {"machine": machine_info(), "cpu_flags": cpu_flags(), "load": os.getloadavg()}
        if args.ucx_error_modes:
            result["runs"] = [b6(sizes, args.repeats or 30, not args.no_floor, mode) for mode in args.ucx_error_modes]  # fmt: skip
        else:
            result.update(b6(sizes, args.repeats or 30, not args.no_floor, None))
        print(json.dumps(result, indent=2))
        return
    repeats = args.repeats or (2 if args.quick else 7)
    lengths = [256, 1024] if args.quick else [256, 1024, 4096, 16384]
    result = {
        "benchmark": "pd",
        "machine": machine_info(),
        "cpu_flags": cpu_flags(),
        "load": os.getloadavg(),
        "bytes": bytes_table(lengths),
        "throughput": throughput(sizes, repeats, __file__, _free_port()),
        "ttft_ms": ttft([64] if args.quick else [256, 1024, 2048], 1 if args.quick else repeats),
    }
    if not (args.quick or args.no_floor):
        result["floor"] = floor(sizes, repeats, result["throughput"])
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
