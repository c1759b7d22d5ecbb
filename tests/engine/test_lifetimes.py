"""Issue 26, finding 11: a dropped engine kept its connector alive (4 engines with CPU + disk
tiers created and dropped: RSS 586 -> 1,359 MiB, threads 8 -> 32). Ten engines of each
connector are created and ended, by ``close()`` or by ``del`` + ``gc.collect()``; the process's
OS threads (UCX's and ZMQ's included), open file descriptors (sockets, files) and the Valkey
server's clients are then back at their baseline, and its RSS is back near it."""

from __future__ import annotations

import ctypes
import gc
import os
import socket
import threading
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from hybridkv import LLM, SamplingParams
from hybridkv.engine.lifetime import EngineClosedError
from tests.support.checkpoints import SharedCheckpoints
from tests.support.ports import free_port
from tests.support.valkey_server import ValkeyProcess, running_valkey

NUM_ENGINES = 10
CPU_TIER = 64 << 20  # preallocated (touched) at start-up: a leaked tier is 64 MiB of RSS
# Allowed RSS growth after ten engines. One leaked engine holds at least its 16 MiB device KV
# cache and its weights, and with a CPU tier 64 MiB more: 10 leaked engines would add >= 160 MiB
# (>= 800 MiB with tiers), far above this. What remains is the allocator's: glibc's arenas and
# torch's caches keep some freed memory mapped after the first engines (measured: < 20 MiB).
RSS_TOLERANCE = 64 << 20
PROMPT = list(range(3, 150))  # 4 units of 32 tokens: stores reach every tier
PARAMS = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)

Config = Callable[[Path, ValkeyProcess | None], dict[str, Any] | None]


def offload(root: Path, remote: ValkeyProcess | None = None) -> dict[str, Any]:
    extra: dict[str, Any] = {
        "chunk_tokens": 32,
        "cpu_bytes": CPU_TIER,
        "cpu_prealloc": True,
        "disk_path": str(root / "disk"),
        "disk_bytes": "64MiB",
    }
    if remote is not None:
        extra["remote_url"] = remote.url
    return {"kv_connector": "OffloadingConnector", "kv_connector_extra_config": extra}


def files(root: Path) -> dict[str, Any]:
    return {"kv_connector": "FileConnector", "kv_connector_extra_config": {"path": str(root / "f")}}


CONFIGS: dict[str, Config] = {
    "none": lambda root, remote: None,
    "offload_cpu_disk": lambda root, remote: offload(root),
    "offload_valkey": offload,
    "file": lambda root, remote: files(root),
    "multi": lambda root, remote: {
        "kv_connector": "MultiConnector",
        "kv_connector_extra_config": {"connectors": [offload(root), files(root)]},
    },
    "fault_injection": lambda root, remote: {
        "kv_connector": "FaultInjection",
        "kv_connector_extra_config": {"inner": files(root), "block_failure_rate": 0.5},
    },
    "nixl_producer": lambda root, remote: {
        "kv_connector": "NixlConnector",
        "kv_role": "kv_producer",
        "kv_connector_extra_config": {"side_channel_port": free_port()},
    },
}


@pytest.fixture(scope="module")
def model(shared_checkpoints: SharedCheckpoints) -> Path:
    return shared_checkpoints.get("qwen3")


@pytest.fixture
def valkey_for(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[ValkeyProcess | None]:
    if request.node.callspec.params["kind"] != "offload_valkey":
        yield None
        return
    with running_valkey(tmp_path / "valkey") as server:
        yield server


def make(model: Path, config: dict[str, Any] | None, **extra: Any) -> LLM:
    return LLM(str(model), dtype="float32", kv_cache_memory="16MiB", block_size=16,
               max_model_len=512, kv_transfer_config=config, **extra)  # fmt: skip


def snapshot(remote: ValkeyProcess | None) -> tuple[int, int, int, int]:
    """(OS threads, open fds, Valkey clients, RSS bytes) after a full collection; freed heap
    is handed back to the OS first (``malloc_trim``), so RSS counts what is still held."""
    gc.collect()
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    clients = 0
    if remote is not None:
        with remote.client() as probe:
            clients = int(probe.info("clients")["connected_clients"]) - 1  # not the probe
    with open("/proc/self/statm") as f:
        rss = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    return len(os.listdir("/proc/self/task")), len(os.listdir("/proc/self/fd")), clients, rss


def run_once(model: Path, config: dict[str, Any] | None, by_close: bool) -> None:
    llm = make(model, config)
    outs = llm.generate([PROMPT, PROMPT], PARAMS, use_tqdm=False)
    assert all(len(o.token_ids) == 4 for o in outs)
    if by_close:
        llm.close()
    del llm


@pytest.mark.slow
@pytest.mark.parametrize("by_close", [True, False], ids=["close", "del_gc"])
@pytest.mark.parametrize("kind", sorted(CONFIGS))
def test_ended_engines_give_back_threads_fds_and_memory(
    model: Path, tmp_path: Path, kind: str, by_close: bool, valkey_for: ValkeyProcess | None
) -> None:
    def config() -> dict[str, Any] | None:
        return CONFIGS[kind](tmp_path, valkey_for)

    run_once(model, config(), by_close)  # warm-up: torch's pools, ZMQ's and UCX's singletons
    threads, fds, clients, rss = snapshot(valkey_for)
    for _ in range(NUM_ENGINES):
        run_once(model, config(), by_close)
    threads_after, fds_after, clients_after, rss_after = snapshot(valkey_for)
    # no more threads than before (one started by an earlier test may have ended meanwhile)
    assert threads_after <= threads
    assert (fds_after, clients_after) == (fds, clients)
    grown = rss_after - rss
    assert grown < RSS_TOLERANCE, f"RSS grew {grown >> 20} MiB over {NUM_ENGINES} engines"


@pytest.mark.slow
def test_kv_events_sockets_close_with_the_engine(model: Path, tmp_path: Path) -> None:
    events = {
        "enable_kv_cache_events": True,
        "endpoint": f"ipc://{tmp_path}/events",
        "replay_endpoint": f"ipc://{tmp_path}/replay",
    }
    for _ in range(2):  # warm-up: ZMQ's context and its I/O thread live for the process
        with make(model, offload(tmp_path), kv_events_config=events) as llm:
            llm.generate([PROMPT], PARAMS, use_tqdm=False)
    threads, fds, _, _ = snapshot(None)
    for _ in range(3):
        with make(model, offload(tmp_path), kv_events_config=events) as llm:
            llm.generate([PROMPT], PARAMS, use_tqdm=False)
    assert snapshot(None)[:2] == (threads, fds)


def test_close_is_idempotent_and_a_closed_llm_says_so(model: Path, tmp_path: Path) -> None:
    with make(model, offload(tmp_path)) as llm:
        engine = llm.engine
        assert llm.generate([PROMPT], PARAMS, use_tqdm=False)[0].token_ids
    assert engine.closed
    llm.close()  # again: nothing happens
    for call in (
        lambda: llm.generate([PROMPT], PARAMS, use_tqdm=False),
        lambda: llm.chat([{"role": "user", "content": "hi"}], PARAMS, use_tqdm=False),
        lambda: llm.reset_prefix_cache(),
        lambda: llm.engine,
    ):
        with pytest.raises(EngineClosedError, match="closed"):
            call()
    with pytest.raises(EngineClosedError, match="shut down"):
        engine.add_request(PROMPT, PARAMS)
    with pytest.raises(EngineClosedError, match="shut down"):
        engine.step()


@pytest.mark.slow
def test_an_engine_that_fails_to_start_releases_what_it_built(model: Path, tmp_path: Path) -> None:
    """The NIXL agent is created and the cache registered before the side channel's port
    turns out to be taken: the failed constructor releases them (and the tiers of a
    MultiConnector's first child when its second cannot start)."""
    run_once(model, CONFIGS["nixl_producer"](tmp_path, None), True)  # warm-up: UCX, NIXL
    before = snapshot(None)[:2]
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        nixl = {"kv_connector": "NixlConnector", "kv_role": "kv_producer",
                "kv_connector_extra_config": {"side_channel_port": port}}  # fmt: skip
        multi = {"kv_connector": "MultiConnector",
                 "kv_connector_extra_config": {"connectors": [offload(tmp_path), nixl]}}  # fmt: skip
        for config in (nixl, multi):
            with pytest.raises(ValueError, match="side channel"):
                make(model, config)
    assert snapshot(None)[:2] == before


def test_dropping_the_last_reference_ends_the_engine_without_the_collector(
    model: Path, tmp_path: Path
) -> None:
    """The engine is in no reference cycle: ``del llm`` alone runs its finalizer, and the
    tier threads it started are gone before any collection."""
    run_once(model, offload(tmp_path), True)  # warm-up: tqdm's monitor lives for the process
    before = threading.active_count()  # Python's: OpenMP's native team may grow meanwhile
    gc.disable()
    try:
        llm = make(model, offload(tmp_path))
        llm.generate([PROMPT], PARAMS, use_tqdm=False)
        engine = weakref.ref(llm.engine)
        assert threading.active_count() > before  # the disk tier's workers
        del llm
        assert engine() is None
        assert threading.active_count() == before
    finally:
        gc.enable()
