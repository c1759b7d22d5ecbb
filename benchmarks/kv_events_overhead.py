"""What publishing KV events costs a step: the same workload with events off, on with the
null publisher (batches built, none sent) and on with the ZMQ publisher read by a subscriber
in another process.

Workload: the embedded tiny Granite 4.0-H-style hybrid, prompts sharing a few long prefixes
(so blocks are stored, hit and evicted every few steps: a small KV pool), greedy. Runs
alternate off / null / zmq after one warm-up of each. Two numbers per mode:

    step_ms          wall time of ``generate`` / engine steps (the end-to-end view)
    publish_us_step  time the engine thread spent in ``KVEventCollector.publish_step`` per
                     step (conversion + queueing; the encode and send run on the publisher's
                     thread, which competes for the GIL: that shows in step_ms only)

A second, steadier measurement (``micro``): a loop of synthetic steps (10 float32 384x384
matmuls, ~2 ms of torch compute that releases the GIL) each publishing a batch of 3
``BlockStored`` events of 4 blocks, with the null publisher and with the ZMQ one: the median
step time and the time ``publish`` takes.

    .venv/bin/python benchmarks/kv_events_overhead.py           # 3 rounds
    .venv/bin/python benchmarks/kv_events_overhead.py --quick   # 1 round, small, no warm-up
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench_common import machine_info
from hybridkv import LLM, SamplingParams
from hybridkv.kv_events.collector import KVEventCollector

SUBSCRIBER = """
import sys, zmq
sub = zmq.Context.instance().socket(zmq.SUB)
sub.setsockopt(zmq.SUBSCRIBE, b"")
sub.connect(sys.argv[1])
print("ready", flush=True)
n = 0
while sub.poll(600000):  # decode steps store a block every block_size tokens: long gaps
    sub.recv_multipart()
    n += 1
    print(n, flush=True)
"""


def prompts(num: int, prefix_len: int, tail_len: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    prefixes = [[rng.randrange(3, 1000) for _ in range(prefix_len)] for _ in range(4)]
    return [prefixes[i % 4] + [rng.randrange(3, 1000) for _ in range(tail_len)] for i in range(num)]


def run(mode: str, work: list[list[int]], max_tokens: int, tmp: Path) -> dict[str, float]:
    options: dict[str, Any] = {"kv_cache_memory": "3MiB", "max_num_seqs": 8, "num_state_slots": 32,
                               "max_model_len": 1024, "dtype": "float32"}  # fmt: skip
    sub = None
    if mode != "off":
        endpoint = f"ipc://{tmp}/{mode}-{time.monotonic_ns()}.sock"
        options["kv_events_config"] = {"enable_kv_cache_events": True, "publisher":
                                       "null" if mode == "null" else "zmq", "endpoint": endpoint}  # fmt: skip
    llm = LLM(**options)
    if mode == "zmq":
        sub = subprocess.Popen([sys.executable, "-c", SUBSCRIBER, options["kv_events_config"]["endpoint"]],
                               stdout=subprocess.PIPE, text=True)  # fmt: skip
        assert sub.stdout is not None and sub.stdout.readline().strip() == "ready"
        time.sleep(0.3)  # the subscription reaches the PUB socket
    spent = [0.0]
    collector = llm.engine.kv_events
    if collector is not None:
        inner = collector.publish_step

        def timed(events: Any) -> None:
            t = time.perf_counter()
            inner(events)
            spent[0] += time.perf_counter() - t

        collector.publish_step = timed  # type: ignore[method-assign]
    steps = [0]
    step = llm.engine.step

    def counted() -> Any:
        steps[0] += 1
        return step()

    llm.engine.step = counted  # type: ignore[method-assign]
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    start, cpu = time.perf_counter(), time.process_time()
    llm.generate(work, params, use_tqdm=False)
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    out = {"step_ms": 1e3 * wall / steps[0], "cpu_ms_step": 1e3 * cpu / steps[0],
           "publish_us_step": 1e6 * spent[0] / steps[0], "steps": steps[0]}  # fmt: skip
    if collector is not None:
        collector.publisher.flush(10.0)  # the thread polls: on a loaded machine it may lag the run
        out["batches"] = collector.stats().published_batches
        out["dropped"] = collector.stats().dropped_batches
    llm.engine.shutdown()
    if sub is not None:
        time.sleep(1.0)  # the last batches reach the subscriber
        sub.terminate()
        stdout, _ = sub.communicate(timeout=30)
        counts = [int(word) for word in stdout.split() if word.isdigit()]
        out["received"] = counts[-1] if counts else 0
    return out


def micro(iterations: int, tmp: Path) -> dict[str, dict[str, float]]:
    import torch

    from hybridkv.kv_events.config import KVEventsConfig
    from hybridkv.kv_events.publisher import EventPublisher, NullPublisher, ZmqEventPublisher
    from hybridkv.kv_events.schema import BlockStored, KVEventBatch

    a = torch.randn(384, 384)

    def batch() -> KVEventBatch:
        events = [BlockStored(block_hashes=[os.urandom(32) for _ in range(4)],
                              parent_block_hash=os.urandom(32), token_ids=list(range(64)),
                              block_size=16, lora_id=None, medium="GPU", lora_name=None,
                              group_idx=g) for g in range(3)]  # fmt: skip
        return KVEventBatch(ts=time.time(), events=list(events), data_parallel_rank=0)

    def loop(pub: EventPublisher) -> dict[str, float]:
        steps, publishes = [], []
        for _ in range(iterations):
            t0 = time.perf_counter()
            for _ in range(10):
                a @ a
            t1 = time.perf_counter()
            pub.publish(batch())
            t2 = time.perf_counter()
            steps.append(t2 - t0)
            publishes.append(t2 - t1)
        return {"step_ms": round(1e3 * statistics.median(steps), 3),
                "publish_us_median": round(1e6 * statistics.median(publishes), 1),
                "publish_us_mean": round(1e6 * statistics.mean(publishes), 1)}  # fmt: skip

    zmq_pub = ZmqEventPublisher(KVEventsConfig(True, "zmq", f"ipc://{tmp}/micro.sock"))
    try:
        out = {"null": loop(NullPublisher()), "zmq": loop(zmq_pub)}
    finally:
        zmq_pub.shutdown()
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--cache-dir", default=None, help="$HYBRIDKV_CACHE_DIR (the default model)")
    args = ap.parse_args()
    if args.cache_dir is not None:
        os.environ["HYBRIDKV_CACHE_DIR"] = args.cache_dir
    rounds = 1 if args.quick else args.rounds
    work = prompts(8, 64, 16) if args.quick else prompts(args.prompts, 256, 48)
    max_tokens = 4 if args.quick else 24
    modes = ("off", "null", "zmq")
    results: dict[str, list[dict[str, float]]] = {m: [] for m in modes}
    with tempfile.TemporaryDirectory() as tmp:
        for m in () if args.quick else modes:  # warm-up (--quick checks paths, not times)
            run(m, work[:4], 2, Path(tmp))
        micro_results = micro(30 if args.quick else 500, Path(tmp))
        for r in range(rounds):
            for m in modes[r % 3 :] + modes[: r % 3]:  # rotate: load drifts during a round
                results[m].append(run(m, work, max_tokens, Path(tmp)))
    summary = {}
    for m in modes:
        step = statistics.median(r["step_ms"] for r in results[m])
        cpu = statistics.median(r["cpu_ms_step"] for r in results[m])
        summary[m] = {"step_ms": round(step, 3), "cpu_ms_step": round(cpu, 3),
                      "publish_us_step": round(statistics.median(r["publish_us_step"] for r in results[m]), 1),
                      "runs": results[m]}  # fmt: skip
    base, base_cpu = summary["off"]["step_ms"], summary["off"]["cpu_ms_step"]
    for m in ("null", "zmq"):
        summary[m]["step_vs_off"] = round(summary[m]["step_ms"] / base, 3)
        summary[m]["cpu_vs_off"] = round(summary[m]["cpu_ms_step"] / base_cpu, 3)
        summary[m]["publish_share"] = round(summary[m]["publish_us_step"] / 1e3 / base, 4)
    report = {"benchmark": "kv_events_overhead", "quick": args.quick, "machine": machine_info(loadavg=os.getloadavg(), cpu_flags=_cpu_flags()),
              "workload": {"prompts": len(work), "prompt_len": len(work[0]), "max_tokens": max_tokens},
              "results": summary, "micro": micro_results}  # fmt: skip
    print(json.dumps(report, indent=1))
    print(f"micro {micro_results}", file=sys.stderr)
    for m in modes:
        s = summary[m]
        print(f"{m:5s} step {s['step_ms']:.2f} ms (x{s.get('step_vs_off', 1.0)})  cpu "
              f"{s['cpu_ms_step']:.2f} ms/step (x{s.get('cpu_vs_off', 1.0)})  publish "
              f"{s['publish_us_step']:.0f} us/step", file=sys.stderr)  # fmt: skip


def _cpu_flags() -> list[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return []
    for line in text.splitlines():
        if line.startswith("flags"):
            wanted = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "fma")
            return [f for f in line.split(":", 1)[1].split() if f in wanted]
    return []


_ = KVEventCollector  # the class whose publish_step is timed

if __name__ == "__main__":
    main()
