"""A device-free P/D pair for the window tests: real schedulers, coordinators and NixlConnector
scheduler halves on both sides, a ``PageRunner`` as each side's model, and a worker that moves
"bytes" exactly as the reader's plan says (``plan.load_rows``).

Memory is simulated byte by byte: each engine's pages are a numpy array laid out as the real
backing tensors are (block b at ``b * page``, K then V, ``token_bytes`` per token), filled from
the PageRunner's entries before a load and written back after it. A slot whose bytes were not
all written by the load keeps what it held before (a stale or never-written entry), so a block
that is hashed without its bytes shows up as a hashed block whose page disagrees with its
tokens (``hashed_without_bytes``), and as wrong tokens when a later hit reads it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hybridkv.config import SchedulerConfig
from hybridkv.connectors.base import BaseConnectorWorker
from hybridkv.connectors.config import LoadFailurePolicy
from hybridkv.connectors.nixl.layout import LayoutDescriptor, group_descs
from hybridkv.connectors.nixl.meta import RemoteSource
from hybridkv.connectors.nixl.options import NixlOptions
from hybridkv.connectors.nixl.plan import load_rows
from hybridkv.connectors.nixl.scheduler import NixlScheduler
from hybridkv.engine.step import run_step
from hybridkv.kv.block_pool import NULL_BLOCK
from hybridkv.kv.coordinator import KVCacheConfig, KVCacheCoordinator
from hybridkv.kv.hashing import BlockHash, BlockHasher, get_hash_fn
from hybridkv.kv.spec import KVCacheLayout, create_layout
from hybridkv.request import Request
from hybridkv.sampling.params import SamplingParams
from hybridkv.sched.kv_transfer import KVTransfer
from hybridkv.sched.scheduler import Scheduler
from hybridkv.step_io import ConnectorMetadata, KVConnectorOutput, LoadSpec
from tests.connectors.nixl.signing import policy
from tests.kv.builders import full, swa
from tests.sched.page_runner import PageRunner

MAX_MODEL_LEN = 1024
Entry = tuple[int, int] | None  # a PageRunner slot: (attention group index, token id)


def _encode(entry: Entry) -> int:
    return 0 if entry is None else (entry[0] + 1) << 20 | (entry[1] + 1)


def _decode(code: int) -> Entry:
    return None if code == 0 else ((code >> 20) - 1, (code & ((1 << 20) - 1)) - 1)


class SimMemory:
    """One engine's attention pages as bytes (one layer per group: every group's layer 0 is
    backing tensor 0; block ids are unique across groups, as in the real pool)."""

    def __init__(self, layout: KVCacheLayout, runner: PageRunner, num_blocks: int) -> None:
        groups = group_descs(layout)
        self.tb = next(g.token_bytes for g in groups if g.token_bytes)
        self.b = layout.block_size
        self.page = 2 * self.b * self.tb
        self.runner = runner
        self.bytes = np.zeros(num_blocks * self.page, dtype=np.int64)
        self.desc = LayoutDescriptor("sim", "c", self.b, self.page, (0,), groups, (), 0, 0)

    def fill(self, block_ids: list[int]) -> None:
        """Bytes of these blocks from the runner's entries (both K and V)."""
        for b in block_ids:
            page = self.runner.pages.get(b, [None] * self.b)
            codes = np.repeat(np.array([_encode(e) for e in page], dtype=np.int64), self.tb)
            self.bytes[b * self.page : (b + 1) * self.page] = np.tile(codes, 2)

    def store(self, block_ids: list[int]) -> None:
        """The runner's entries from these blocks' bytes: a slot is an entry only if all its
        K and V bytes agree."""
        for b in block_ids:
            raw = self.bytes[b * self.page : (b + 1) * self.page].reshape(2, self.b, self.tb)
            page: list[Entry] = []
            for s in range(self.b):
                codes = np.unique(raw[:, s, :])
                page.append(_decode(int(codes[0])) if len(codes) == 1 else None)
            self.runner.pages[b] = page


class SimWorker(BaseConnectorWorker):
    """A consumer's worker half: executes each load's plan against the producer's memory at
    once; reports it finished at the next ``get_finished``. A producer's does nothing (its
    blocks stay held: sends never finish)."""

    def __init__(self, memory: SimMemory, producer: SimMemory | None) -> None:
        self.memory, self.producer = memory, producer
        self.done: set[str] = set()
        self.failed: dict[str, str] = {}
        self.failures: list[str] = []  # every failure reported, in order
        self.loads: list[LoadSpec] = []

    def start_load(self, metadata: ConnectorMetadata) -> None:
        for spec in metadata.loads:
            assert self.producer is not None
            self.loads.append(spec)
            self.done.add(spec.request_id)
            try:
                self._load(spec, self.producer)
            except ValueError as exc:  # as the reader: this load fails, recovery recomputes
                self.failed[spec.request_id] = f"nixl_transfer_failed: {exc}"
                self.failures.append(self.failed[spec.request_id])

    def _load(self, spec: LoadSpec, producer: SimMemory) -> None:
        src = spec.keys
        assert isinstance(src, RemoteSource)
        producer.fill([b for t in src.block_ids for b in t if b != NULL_BLOCK])
        local = [b for ids in spec.block_ids for b in ids]
        self.memory.fill(local)
        rows = load_rows(self.memory.desc, producer.desc, spec, src)
        for la, ra, n in np.asarray(rows, dtype=np.int64).reshape(-1, 3).tolist():
            self.memory.bytes[la : la + n] = producer.bytes[ra : ra + n]
        self.memory.store(local)

    def save(self, metadata: ConnectorMetadata) -> None:
        return None

    def get_finished(self, finished_request_ids: list[str]) -> KVConnectorOutput:
        out = KVConnectorOutput(finished_recving=self.done, failed_recving=self.failed)
        self.done, self.failed = set(), {}
        return out


@dataclass
class SimEngine:
    scheduler: Scheduler
    kv: KVCacheCoordinator
    runner: PageRunner
    memory: SimMemory
    worker: SimWorker
    tokens_of: dict[BlockHash, tuple[int, ...]] = field(default_factory=dict)
    outputs: dict[str, list[int]] = field(default_factory=dict)
    strict: bool = True  # assert the invariant after every step

    def add(self, rid: str, prompt: list[int], max_tokens: int, params: Any = None) -> Request:
        hasher = BlockHasher(self.kv.block_size, get_hash_fn("sha256"))
        extra = {"kv_transfer_params": params} if params is not None else None
        sampling = SamplingParams(max_tokens=max_tokens, temperature=0.0, extra_args=extra)
        req = Request(rid, prompt, sampling, hasher)
        self.scheduler.add_request(req)
        return req

    def run(self, max_steps: int = 2000) -> None:
        for _ in range(max_steps):
            if not self.scheduler.requests:  # a producer's sends never finish: its KV stays
                return
            _, _, updated = run_step(self.scheduler, self.runner, self.worker)
            for req in updated:
                self.outputs[req.request_id] = list(req.output_token_ids)
            self._note_hashes([*self.scheduler.requests.values(), *updated])
            self.kv.check_integrity()
            bad = self.hashed_without_bytes()
            assert not (bad and self.strict), bad
        raise AssertionError("requests did not finish")

    def _note_hashes(self, requests: list[Request]) -> None:
        b = self.kv.block_size
        for req in requests:
            for k, h in enumerate(req.block_hashes):
                self.tokens_of[h] = tuple(req.all_token_ids[k * b : (k + 1) * b])

    def hashed_without_bytes(self) -> list[str]:
        """Every hashed block whose page does not hold its tokens' KV (the invariant)."""
        attn = list(self.kv.layout.attention_group_ids)
        bad = []
        for block, key in enumerate(self.kv.pool.key):
            if key is None or block == NULL_BLOCK:
                continue
            block_hash, gid = key
            want = [(attn.index(gid), t) for t in self.tokens_of[block_hash]]
            got = self.runner.pages.get(block)
            if got != want:
                wrong = [s for s, w in enumerate(want) if got is None or got[s] != w]
                bad.append(f"block {block} (group {gid}) hashed, slots {wrong} not its tokens")
        return bad


def make_engine(
    block_size: int,
    window: int,
    role: str,
    producer: SimEngine | None = None,
    num_blocks: int = 0,
    budget: int = 64,
) -> SimEngine:
    """A Gemma-3-like engine (one sliding-window and one full-attention group) with the
    NixlConnector's scheduler half as ``kv_producer`` or ``kv_consumer``."""
    num_blocks = num_blocks or 4 * (MAX_MODEL_LEN // block_size + 8)
    layout = create_layout([swa(window, block_size), full(block_size)], block_size=block_size)
    kv = KVCacheCoordinator(
        layout, KVCacheConfig(num_blocks, 0, True, 0, enable_kv_cache_events=False)
    )
    options = NixlOptions(heartbeat_interval_seconds=0)
    is_producer = role == "kv_producer"
    nixl = NixlScheduler(
        options, role, group_descs(layout), block_size, is_producer, not is_producer, policy()
    )
    transfer = KVTransfer(nixl, LoadFailurePolicy("recompute"), kv)
    config = SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=budget)
    runner = PageRunner(layout)
    memory = SimMemory(layout, runner, num_blocks)
    worker = SimWorker(memory, None if producer is None else producer.memory)
    return SimEngine(Scheduler(config, MAX_MODEL_LEN, kv, transfer), kv, runner, memory, worker)
