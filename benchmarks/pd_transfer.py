"""B6 throughput: a consumer's load through the NixlConnector's own read path (``Reader``:
plan, data READ, lease-word check, polling as an idle engine does; the notification, which the
worker sends at the end of the next engine step, is timed apart as ``notify``)
against the same bytes copied between the same two processes through shared memory, and
against ``process_vm_readv`` (the kernel call UCX's same-host ``cma`` transport makes). ``wire``
is the load's two READs alone (data, then the lease word) through the connector's agent: what
NIXL costs with no hybridkv planning or bookkeeping, in the same alternation (so the same cache
state) as the load; ``wire_vs_copy`` bounds what any NIXL load can reach, ``load_vs_wire`` is
hybridkv's own share.

Geometry: one full-attention group of ``LAYERS`` layers, block size 16, ``TOKEN_BYTES`` per
token of K (or V) per layer, so a load of T tokens moves ``T * 2 * TOKEN_BYTES * LAYERS``
bytes. ``contiguous``: both tables are runs of consecutive blocks (one descriptor per layer);
``scattered``: shuffled tables on both sides (one descriptor per block per layer).
"""

from __future__ import annotations

import ctypes
import random
import statistics
import subprocess
import sys
import threading
import time
from multiprocessing import resource_tracker, shared_memory
from typing import Any

import numpy as np
import torch

from hybridkv.connectors.nixl.agent import NixlAgent, XferState
from hybridkv.connectors.nixl.auth import AuthKey
from hybridkv.connectors.nixl.handshake import Peers
from hybridkv.connectors.nixl.layout import GroupDesc, LayoutDescriptor
from hybridkv.connectors.nixl.meta import Lease, RemoteSource
from hybridkv.connectors.nixl.options import NixlOptions
from hybridkv.connectors.nixl.reader import SCRATCH_WORDS, Reader
from hybridkv.connectors.nixl.side_channel import SideChannelServer
from hybridkv.connectors.nixl.stats import NixlStats
from hybridkv.connectors.nixl.worker import POLL_SECONDS
from hybridkv.connectors.stats import StatsCounter
from hybridkv.model.step.host_memory import zeros_huge
from hybridkv.step_io import LoadSpec

LAYERS, TOKEN_BYTES, BLOCK = 4, 512, 16
PAGE = 2 * BLOCK * TOKEN_BYTES
TOKEN_TOTAL = 2 * TOKEN_BYTES * LAYERS  # bytes one token moves
STEP_SECONDS = 0.005  # the producer's engine steps this often
# An engine's per-layer backing tensor holds its whole KV cache (hundreds of MiB): at least
# this much per layer, so that, as there, the blocks read lie on huge pages.
MIN_LAYER_BYTES = 8 << 20

KEY = AuthKey(b"benchmark-deployment-key", "bench")  # both processes: the handshake


def cache_blocks(max_bytes: int) -> int:
    """Blocks per layer of a side's cache for loads of up to ``max_bytes``."""
    return max(max_bytes // (BLOCK * TOKEN_TOTAL) + 2, MIN_LAYER_BYTES // PAGE)


class Cache:
    """One side's registered memory: per-layer backing tensors, lease/scratch words."""

    def __init__(self, name: str, num_blocks: int, fill: bool) -> None:
        self.num_blocks = num_blocks
        self.backing = [zeros_huge((num_blocks * PAGE,), torch.uint8) for _ in range(LAYERS)]
        for t in self.backing:
            t.fill_(1)  # touch every page (a real cache is written before it is read)
        if fill:
            for i, t in enumerate(self.backing):
                t.copy_((torch.arange(t.numel(), dtype=torch.int64) * 7 + i).to(torch.uint8))
        self.words = torch.zeros(1 + SCRATCH_WORDS, dtype=torch.int64)
        self.words[0] = 1  # lease (slot 0, generation 1): active
        self.agent = NixlAgent(name, progress_thread=name == "bench-producer")
        self.agent.register([(t.data_ptr(), t.numel()) for t in self.backing])
        self.agent.register([(self.words.data_ptr(), self.words.numel() * 8)])
        self.descriptor = LayoutDescriptor(
            engine_id=name, compat="bench", block_size=BLOCK, layer_page_bytes=PAGE,
            backing=tuple(t.data_ptr() for t in self.backing),
            groups=(GroupDesc("full_attention", 0, LAYERS, TOKEN_BYTES),), state_tensors=(),
            staging_base=0, staging_stride=0, agent_metadata=self.agent.metadata(),
            lease_base=self.words.data_ptr(), lease_words=1, model_id="bench:bench:bench",
            num_blocks=num_blocks,
        )  # fmt: skip


def serve_producer(port: int, max_bytes: int, shm_name: str) -> None:
    """The producer process: a filled cache and the shared-memory twin of the baseline."""
    cache = Cache("bench-producer", cache_blocks(max_bytes), fill=True)
    shm = shared_memory.SharedMemory(name=shm_name)
    resource_tracker.unregister(shm._name, "shared_memory")  # the parent owns (unlinks) it
    pattern = (np.arange(max_bytes, dtype=np.int64) % 251).astype(np.uint8)
    np.copyto(np.ndarray((max_bytes,), np.uint8, shm.buf), pattern)
    server = SideChannelServer("127.0.0.1", port, cache.descriptor.encode(), KEY)
    import os

    bases = ",".join(str(t.data_ptr()) for t in cache.backing)
    print("ready", os.getpid(), bases, flush=True)
    done = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.read(), done.set()), daemon=True).start()
    while not done.wait(STEP_SECONDS):  # an engine holding leases polls once a step
        cache.agent.notifications()
    server.close()
    shm.close()


class Consumer:
    def __init__(self, port: int, max_bytes: int) -> None:
        self.port = port
        self.cache = Cache("bench-consumer", cache_blocks(max_bytes), fill=False)
        stats = StatsCounter(NixlStats)
        options = NixlOptions()
        peers = Peers(self.cache.agent, self.cache.descriptor, 10.0, stats, KEY)
        scratch = self.cache.words[1:]
        self.reader = Reader(options, self.cache.agent, peers, self.cache.descriptor, stats, scratch)  # fmt: skip
        self.count = 0

    def load(self, tokens: int, scattered: bool) -> tuple[float, float, int, float, float]:
        """One load as the worker runs it: (wall s, this thread's CPU s, descriptors), then
        the notification the Reader sends at its next call (wall s, CPU s)."""
        nb = -(-tokens // BLOCK)
        local, remote = list(range(1, nb + 1)), list(range(1, nb + 1))
        if scattered:
            rng = random.Random(self.count)
            local = rng.sample(range(1, self.cache.num_blocks), nb)
            remote = rng.sample(range(1, self.cache.num_blocks), nb)
        self.count += 1
        rid = f"r{self.count}"
        src = RemoteSource("bench-producer", "127.0.0.1", self.port, rid, (tuple(remote),), (0,), None, tokens, Lease(0, 1))  # fmt: skip
        spec = LoadSpec(rid, 0, tokens, (local,), (list(range(nb)),), (), True, src)
        c0, t0 = time.thread_time(), time.perf_counter()
        self.reader.add(spec, time.monotonic())
        delay = POLL_SECONDS[0]
        while not self.reader.done:  # as NixlWorker.wait_for_progress polls
            if not self.reader.progress():
                time.sleep(delay)
                delay = min(2 * delay, POLL_SECONDS[1])
        wall, cpu = time.perf_counter() - t0, time.thread_time() - c0
        done = self.reader.done.pop()
        if done.request_reason is not None:
            raise RuntimeError(done.request_reason)
        self.reader.end_step()  # this step's end: the notification waits a step
        c0, t0 = time.thread_time(), time.perf_counter()
        sent = self.reader.end_step()  # the next step's end (after a forward): sends it
        notify_wall, notify_cpu = time.perf_counter() - t0, time.thread_time() - c0
        assert sent == 1
        return wall, cpu, self.reader.stats.take().descriptors, notify_wall, notify_cpu

    def wire(self, rows: list[tuple[int, int, int]]) -> None:
        """A load's wire work alone: the data READ of ``rows`` and the lease word's READ,
        through the connector's agent, each polled to its end (no plan, no Reader)."""
        peer = next(iter(self.reader.peers._peers.values()))  # the handshake's, cached
        agent = self.cache.agent
        for handle, state in (
            agent.read(peer.agent_name, rows, b""),
            agent.read_prepared(self.reader._scratch_list, 0, peer.leases, 0),
        ):
            while state is XferState.PROC:
                state = agent.state(handle)
            agent.release(handle)
            assert state is XferState.DONE


class _Iovec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


_LIBC = ctypes.CDLL(None, use_errno=True)


def _pvr(pid: int, local: list[int], remote: list[int], size: int) -> None:
    """One ``process_vm_readv`` of ``size`` bytes from each layer (the contiguous load)."""
    libc = _LIBC
    n = len(local)
    lv = (_Iovec * n)(*[_Iovec(a, size) for a in local])
    rv = (_Iovec * n)(*[_Iovec(a, size) for a in remote])
    if libc.process_vm_readv(pid, lv, n, rv, n, 0) != size * n:
        raise OSError(ctypes.get_errno(), "process_vm_readv")


def summary(values: list[float]) -> dict[str, float]:
    return {"median": round(statistics.median(values), 3), "min": round(min(values), 3), "max": round(max(values), 3)}  # fmt: skip


def throughput(sizes: list[int], repeats: int, script: str, port: int) -> dict[str, Any]:
    """GB/s (wall and per CPU second of the reading thread) by transfer size."""
    top = max(sizes)
    shm = shared_memory.SharedMemory(create=True, size=top)
    cmd = [sys.executable, script, "--serve-producer", str(port), str(top), shm.name]
    proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        for line in proc.stdout:  # NIXL may log to stdout too
            if line.startswith("ready "):
                _, pid, bases = line.split()
                break
        else:
            raise RuntimeError("the producer process did not start")
        consumer = Consumer(port, top)
        src, dst = np.ndarray((top,), np.uint8, shm.buf), np.ones(top, np.uint8)
        remote = [int(b) for b in bases.split(",")]
        return {str(size): _measure(consumer, size, repeats, src, dst, int(pid), remote) for size in sizes}  # fmt: skip
    finally:
        if proc.stdin is not None:
            proc.stdin.close()
        proc.wait(30)
        shm.close()
        shm.unlink()


def _measure(
    c: Consumer,
    size: int,
    repeats: int,
    src: np.ndarray,
    dst: np.ndarray,
    pid: int,
    rbase: list[int],
) -> dict[str, Any]:
    tokens = max(1, size // TOKEN_TOTAL)
    nbytes = tokens * TOKEN_TOTAL
    c.load(tokens, False)  # warm-up (handshake, connection)
    end = PAGE + min(tokens, BLOCK) * TOKEN_BYTES  # block 1's K bytes the load wrote
    want = ((np.arange(PAGE, end, dtype=np.int64) * 7) % 256).astype(np.uint8)
    assert np.array_equal(c.cache.backing[0].numpy()[PAGE:end], want), "wrong bytes"
    runs: dict[str, list[float]] = {k: [] for k in ("load", "load_scattered", "wire", "pvr", "shm_copy", "notify")}  # fmt: skip
    cpu: dict[str, list[float]] = {k: [] for k in runs}
    descs: dict[str, int] = {}
    local = [t.data_ptr() + PAGE for t in c.cache.backing]
    remote = [b + PAGE for b in rbase]
    rows = [(a, b, nbytes // LAYERS) for a, b in zip(local, remote, strict=True)]
    for _ in range(repeats):
        for key, scattered in (("load", False), ("load_scattered", True)):
            wall, used, descs[key], notify_wall, notify_cpu = c.load(tokens, scattered)
            runs[key].append(wall)
            cpu[key].append(used)
            if not scattered:
                runs["notify"].append(notify_wall)
                cpu["notify"].append(notify_cpu)
        for key, fn in (
            ("wire", lambda: c.wire(rows)),
            ("pvr", lambda: _pvr(pid, local, remote, nbytes // LAYERS)),
            ("shm_copy", lambda: np.copyto(dst[:nbytes], src[:nbytes])),
        ):
            c0, t0 = time.thread_time(), time.perf_counter()
            fn()
            runs[key].append(time.perf_counter() - t0)
            cpu[key].append(time.thread_time() - c0)
    row: dict[str, Any] = {"bytes": nbytes, "descriptors": descs}
    row["gbps"] = {k: summary([nbytes / t / 1e9 for t in v]) for k, v in runs.items() if k != "notify"}  # fmt: skip
    row["us"] = {k: round(statistics.median(v) * 1e6, 1) for k, v in runs.items()}
    row["cpu_us"] = {k: round(statistics.median(v) * 1e6, 1) for k, v in cpu.items()}
    g = {k: v["median"] for k, v in row["gbps"].items()}
    row["load_vs_copy"] = round(g["load"] / g["shm_copy"], 3)
    row["load_vs_pvr"] = round(g["load"] / g["pvr"], 3)
    row["wire_vs_copy"] = round(g["wire"] / g["shm_copy"], 3)  # what NIXL alone allows
    row["load_vs_wire"] = round(g["load"] / g["wire"], 3)  # hybridkv's own cost
    row["load_vs_copy_cpu"] = round(row["cpu_us"]["shm_copy"] / max(row["cpu_us"]["load"], 1e-3), 3)  # fmt: skip
    print(f"throughput {size}: {row}", file=sys.stderr, flush=True)
    return row
