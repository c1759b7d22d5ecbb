"""B6 floor: the NixlConnector's wire work with no hybridkv code, against the same baselines.

    .venv/bin/python benchmarks/pd_floor.py                 # this environment's UCX settings
    .venv/bin/python benchmarks/pd_floor.py --sweep         # transports and knobs, one child each
    .venv/bin/python benchmarks/pd_floor.py --quick         # seconds: checks the script runs

Two processes, two NIXL agents (UCX backend), host memory registered, descriptor lists
prepared once. One repetition is exactly a load's wire work: one READ of N bytes polled to
completion, the 8-byte READ of the lease word after it, and a notification (``send_notif``).
Timed beside it, alternating, in the same process: one ``process_vm_readv`` of the same N
bytes (``pvr``, what UCX's same-host ``cma`` transport calls) and ``np.copyto`` of N bytes out
of a shared-memory segment the producer filled (``shm_copy``, B6's baseline). Wall and
reading-thread CPU µs, medians; ``floor_vs_copy`` is B6's ratio for the bare wire work and
``read_and_check_vs_copy`` the same without the notification (which the Reader sends at its
next call, off the load's latency).

``--hugepages``: both sides' registered buffers are 2 MiB aligned and advised
``MADV_HUGEPAGE`` before first touch (transparent huge pages), as ``CacheTensors`` allocates
the KV cache. ``--sweep`` reruns this script per setting (UCX_TLS, protocol selection, the
producer's progress-thread delay, huge pages) with ``UCX_PROTO_INFO=y`` and reports which
transport UCX chose for the READ.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import mmap
import os
import statistics
import subprocess
import sys
import threading
import time
from multiprocessing import resource_tracker, shared_memory
from typing import Any

import numpy as np

SIZES = [4 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20]
HUGE = 2 << 20
_LIBC = ctypes.CDLL(None, use_errno=True)
MADV_HUGEPAGE = 14


def _nixl() -> Any:
    import logging

    import nixl_cu12 as nixl

    logging.getLogger("nixl").setLevel(logging.WARNING)
    return nixl


def make_agent(name: str, progress_thread: bool, delay_us: int) -> Any:
    """An agent whose progress thread (if any) waits ``delay_us`` between rounds (the Python
    API hard-codes 0; the binding's constructor is swapped for this call only), its UCX backend
    created with ``UCX_PARAMS`` (``--ucx-param``)."""
    nixl = _nixl()
    binding = nixl._api.nixlBind
    original = binding.nixlAgent

    def create(agent_name: str, config: Any) -> Any:
        config.pthrDelay = delay_us
        return original(agent_name, config)

    binding.nixlAgent = create
    try:
        config = nixl.nixl_agent_config(enable_prog_thread=progress_thread, backends=[])
        agent = nixl.nixl_agent(name, config)
    finally:
        binding.nixlAgent = original
    agent.create_backend("UCX", dict(UCX_PARAMS))
    return agent


UCX_PARAMS: dict[str, str] = {}  # NIXL UCX backend parameters (e.g. ucx_error_handling_mode)


def buffer(nbytes: int, huge: bool) -> tuple[mmap.mmap, np.ndarray]:
    """Private anonymous memory, 2 MiB aligned, advised for huge pages if ``huge``, touched."""
    m = mmap.mmap(-1, nbytes + HUGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    whole = np.frombuffer(m, np.uint8)
    start = (-whole.ctypes.data) % HUGE
    view = whole[start : start + nbytes]
    if huge and _LIBC.madvise(ctypes.c_void_p(view.ctypes.data), ctypes.c_size_t(nbytes), MADV_HUGEPAGE):  # fmt: skip
        raise OSError(ctypes.get_errno(), "madvise(MADV_HUGEPAGE)")
    view[:] = 1
    return m, view


def anon_huge_kb() -> int:
    with open("/proc/self/smaps_rollup") as f:
        return sum(int(line.split()[1]) for line in f if line.startswith("AnonHugePages"))


def serve(args: argparse.Namespace) -> None:
    """The producer: registered data and lease word, polls notifications every 5 ms."""
    top = max(args.sizes)
    _, data = buffer(top, args.hugepages)
    data[:] = (np.arange(top, dtype=np.int64) % 251).astype(np.uint8)
    words = np.ones(1, np.uint64)
    agent = make_agent("floor-producer", True, args.delay_us)
    agent.register_memory([(data.ctypes.data, top, 0, ""), (words.ctypes.data, 8, 0, "")], "DRAM")
    shm = shared_memory.SharedMemory(name=args.shm)
    resource_tracker.unregister(shm._name, "shared_memory")  # type: ignore[attr-defined]
    np.copyto(np.ndarray((top,), np.uint8, shm.buf), data)
    meta = bytes(agent.get_agent_metadata()).hex()
    print("ready", os.getpid(), data.ctypes.data, words.ctypes.data, anon_huge_kb(), meta, flush=True)  # fmt: skip
    done = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.read(), done.set()), daemon=True).start()
    while not done.wait(0.005):  # an engine holding leases polls once a step
        agent.get_new_notifs()
    shm.close()


class _Iovec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


class Floor:
    """The consumer: prepared lists over the producer's data and lease word and its own."""

    def __init__(self, args: argparse.Namespace, pid: int, data: int, word: int, meta: bytes) -> None:  # fmt: skip
        self.top, self.pid, self.remote_data = max(args.sizes), pid, data
        self.agent = make_agent("floor-consumer", args.consumer_thread, args.delay_us)
        _, self.dst = buffer(self.top, args.hugepages)
        self.scratch = np.zeros(1, np.uint64)
        self.agent.register_memory([(self.dst.ctypes.data, self.top, 0, ""), (self.scratch.ctypes.data, 8, 0, "")], "DRAM")  # fmt: skip
        self.peer = self.agent.add_remote_agent(meta)
        self.busy = args.busy_poll
        self.lists: dict[int, tuple[Any, Any]] = {}
        self.local_word = self.agent.prep_xfer_dlist("NIXL_INIT_AGENT", [(self.scratch.ctypes.data, 8, 0)], "DRAM")  # fmt: skip
        self.far_word = self.agent.prep_xfer_dlist(self.peer, [(word, 8, 0)], "DRAM")
        self.count = 0

    def prepare(self, nbytes: int) -> None:
        local = self.agent.prep_xfer_dlist("NIXL_INIT_AGENT", [(self.dst.ctypes.data, nbytes, 0)], "DRAM")  # fmt: skip
        far = self.agent.prep_xfer_dlist(self.peer, [(self.remote_data, nbytes, 0)], "DRAM")
        self.lists[nbytes] = (local, far)

    def _read(self, local: Any, far: Any) -> int:
        """One READ polled to completion; returns the polls it took (0: done in its post)."""
        handle = self.agent.make_prepped_xfer("READ", local, [0], far, [0])
        state = self.agent.transfer(handle)
        delay, polls = 0.0001, 0
        while state == "PROC":
            polls += 1
            if not self.busy:
                time.sleep(delay)
                delay = min(2 * delay, 0.001)
            state = self.agent.check_xfer_state(handle)
        self.agent.release_xfer_handle(handle)
        if state != "DONE":
            raise RuntimeError(f"NIXL READ ended {state}")
        return polls

    def load(self, nbytes: int) -> dict[str, int]:
        """One load's wire work, timed per part (ns wall)."""
        local, far = self.lists[nbytes]
        self.count += 1
        t0 = time.perf_counter_ns()
        polls = self._read(local, far)
        t1 = time.perf_counter_ns()
        self._read(self.local_word, self.far_word)
        t2 = time.perf_counter_ns()
        self.agent.send_notif(self.peer, f"r{self.count}:{nbytes}".encode())
        t3 = time.perf_counter_ns()
        if int(self.scratch[0]) != 1:
            raise RuntimeError("lease word not read")
        return {"data": t1 - t0, "lease": t2 - t1, "notif": t3 - t2, "polls": polls}

    def pvr(self, nbytes: int) -> None:
        lv, rv = _Iovec(self.dst.ctypes.data, nbytes), _Iovec(self.remote_data, nbytes)
        if _LIBC.process_vm_readv(self.pid, ctypes.byref(lv), 1, ctypes.byref(rv), 1, 0) != nbytes:  # fmt: skip
            raise OSError(ctypes.get_errno(), "process_vm_readv")


def _timed(fn: Any) -> tuple[float, float]:
    c0, t0 = time.thread_time_ns(), time.perf_counter_ns()
    fn()
    return (time.perf_counter_ns() - t0) / 1e3, (time.thread_time_ns() - c0) / 1e3


def measure(args: argparse.Namespace) -> dict[str, Any]:
    top = max(args.sizes)
    shm = shared_memory.SharedMemory(create=True, size=top)
    cmd = [sys.executable, __file__, "--serve", "--shm", shm.name, "--delay-us", str(args.delay_us), "--sizes", *map(str, args.sizes)]  # fmt: skip
    cmd += ["--hugepages"] if args.hugepages else []
    cmd += [x for kv in args.ucx_param for x in ("--ucx-param", kv)]
    proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        fields = next(line.split() for line in proc.stdout if line.startswith("ready "))
        pid, data, word, huge_kb = (int(x) for x in fields[1:5])
        floor = Floor(args, pid, data, word, bytes.fromhex(fields[5]))
        src, copy_dst = np.ndarray((top,), np.uint8, shm.buf), np.ones(top, np.uint8)
        rows = {}
        for size in args.sizes:
            floor.prepare(size)
            for _ in range(3):  # warm-up: connection, caches
                floor.load(size)
            assert np.array_equal(floor.dst[:size], (np.arange(size) % 251).astype(np.uint8))
            rows[str(size)] = _rows(floor, size, args.repeats, src, copy_dst)
            print(f"floor {size}: {rows[str(size)]}", file=sys.stderr, flush=True)
        return {"producer_anon_huge_kb": huge_kb, "consumer_anon_huge_kb": anon_huge_kb(), "by_bytes": rows}  # fmt: skip
    finally:
        if proc.stdin is not None:
            proc.stdin.close()
        proc.wait(30)
        shm.close()
        shm.unlink()


def _rows(floor: Floor, size: int, repeats: int, src: np.ndarray, dst: np.ndarray) -> dict[str, Any]:  # fmt: skip
    wall: dict[str, list[float]] = {k: [] for k in ("floor", "pvr", "shm_copy")}
    cpu: dict[str, list[float]] = {k: [] for k in wall}
    parts: dict[str, list[float]] = {"data": [], "lease": [], "notif": [], "polls": [], "read_and_check": []}  # fmt: skip
    split: dict[str, int] = {}
    for _ in range(repeats):
        split.clear()
        for key, fn in (
            ("floor", lambda: split.update(floor.load(size))),
            ("pvr", lambda: floor.pvr(size)),
            ("shm_copy", lambda: np.copyto(dst[:size], src[:size])),
        ):
            w, c = _timed(fn)
            wall[key].append(w)
            cpu[key].append(c)
        for k, v in split.items():
            parts[k].append(v if k == "polls" else v / 1e3)
        parts["read_and_check"].append((split["data"] + split["lease"]) / 1e3)
    med = {k: round(statistics.median(v), 1) for k, v in wall.items()}
    wire = statistics.median(parts["read_and_check"])
    return {
        "us": med,
        "cpu_us": {k: round(statistics.median(v), 1) for k, v in cpu.items()},
        "floor_parts_us": {k: round(statistics.median(v), 1) for k, v in parts.items()},
        "floor_vs_copy": round(med["shm_copy"] / med["floor"], 3),
        "read_and_check_vs_copy": round(med["shm_copy"] / wire, 3),  # the notification deferred
        "floor_vs_pvr": round(med["pvr"] / med["floor"], 3),
        "pvr_vs_copy": round(med["shm_copy"] / med["pvr"], 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=SIZES)
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--hugepages", action="store_true")
    parser.add_argument("--delay-us", type=int, default=100, help="progress thread delay")
    parser.add_argument("--consumer-thread", action="store_true", help="consumer progress thread")  # fmt: skip
    parser.add_argument("--busy-poll", action="store_true", help="spin instead of backing off")
    parser.add_argument("--ucx-param", action="append", default=[], metavar="KEY=VALUE", help="NIXL UCX backend parameter")  # fmt: skip
    parser.add_argument("--sweep", action="store_true")
    parser.add_argument("--quick", action="store_true", help="seconds: checks the script runs")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--shm", help=argparse.SUPPRESS)
    args = parser.parse_args()
    UCX_PARAMS.update(kv.split("=", 1) for kv in args.ucx_param)
    if args.quick:
        args.sizes, args.repeats = [4096, 1 << 20], 3
    if args.serve:
        serve(args)
        return
    from bench_common import cpu_flags, machine_info

    head = {"machine": machine_info(), "cpu_flags": cpu_flags(), "load": os.getloadavg()}
    if args.sweep:
        from pd_floor_sweep import sweep

        print(json.dumps({**head, "sweep": sweep(args)}, indent=2))
    else:
        ucx = {k: v for k, v in os.environ.items() if k.startswith("UCX_")}
        print(json.dumps({**head, "ucx_env": ucx, "args": vars(args), "floor": measure(args)}, indent=2))  # fmt: skip


if __name__ == "__main__":
    main()
