"""Builders for connector tests: a small hybrid layout, real cache tensors, hashed requests, and
an ``Engine`` that plays the scheduler and runner around one connector pair."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from hybridkv.connectors.base import KVConnectorPair, RequestBlocks
from hybridkv.connectors.file.worker import FileConnectorWorker
from hybridkv.connectors.registry import (
    ConnectorContext,
    create_connector,
    parse_kv_transfer_config,
)
from hybridkv.engine.cache_access import DeviceCacheAccess
from hybridkv.kv.hashing import BlockHash, BlockHasher, get_hash_fn
from hybridkv.kv.spec import (
    FullAttentionSpec,
    KVCacheLayout,
    LayerSpec,
    SlidingWindowSpec,
    StateSpec,
    create_layout,
)
from hybridkv.model.step.cache_tensors import CacheTensors
from hybridkv.step_io import ConnectorMetadata, KVConnectorOutput
from tests.support.lifetimes import track

B = 4
WINDOW = 8
NUM_BLOCKS = 64
NUM_SLOTS = 4


def full() -> FullAttentionSpec:
    return FullAttentionSpec(B, 2, 8, "float32")


def swa(window: int = WINDOW) -> SlidingWindowSpec:
    return SlidingWindowSpec(B, 2, 8, "float32", window)


def mamba() -> StateSpec:
    return StateSpec("mamba2", ((6, 3), (2, 4, 8)), ("float32", "bfloat16"))


LAYOUTS: dict[str, list[LayerSpec | None]] = {
    "full": [full(), full()],
    "full_swa": [full(), swa()],
    "full_state": [full(), mamba()],
    "hybrid": [full(), swa(), mamba()],
}


def make_layout(name: str = "hybrid") -> KVCacheLayout:
    return create_layout(LAYOUTS[name], block_size=B)


@dataclass
class FakeRequest:
    """``KVConnectorRequest`` over a token list with real chained block hashes."""

    request_id: str
    all_token_ids: list[int]
    num_computed_tokens: int = 0
    block_hashes: list[BlockHash] = field(default_factory=list)
    cache_boundaries: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        self.num_prompt_tokens = len(self.all_token_ids)
        BlockHasher(B, get_hash_fn("sha256")).extend(self.block_hashes, self.all_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)

    def append(self, tokens: list[int]) -> None:
        """Output tokens: they extend the hashes but not the prompt."""
        self.all_token_ids += tokens
        BlockHasher(B, get_hash_fn("sha256")).extend(self.block_hashes, self.all_token_ids)


def make_request(rid: str, num_tokens: int, first_token: int = 1) -> FakeRequest:
    return FakeRequest(rid, list(range(first_token, first_token + num_tokens)))


def file_config(path: Path | str, **extra: Any) -> dict[str, Any]:
    return {
        "kv_connector": "FileConnector",
        "kv_connector_extra_config": {"path": str(path), **extra},
    }


def fault_config(
    path: Path | str, inner_extra: dict[str, Any] | None = None, **faults: Any
) -> dict[str, Any]:
    return {
        "kv_connector": "FaultInjection",
        "kv_connector_extra_config": {"inner": file_config(path, **(inner_extra or {})), **faults},
    }


class Engine:
    """One engine's cache tensors and connector pair, driven by hand like the scheduler would."""

    def __init__(
        self,
        config: dict[str, Any],
        layout: KVCacheLayout,
        fingerprint: str = "fp-a",
        seed: int = 0,
    ):
        self.layout = layout
        self.tensors = CacheTensors(layout, NUM_BLOCKS, NUM_SLOTS)
        generator = torch.Generator().manual_seed(seed)
        for t in self.tensors.backing:
            t.copy_(torch.randint(0, 256, t.shape, generator=generator, dtype=torch.uint8))
        for group_states in self.tensors.states.values():
            for t in group_states:
                raw = t.view(-1).view(torch.uint8)
                raw.copy_(torch.randint(0, 128, raw.shape, generator=generator, dtype=torch.uint8))
        self.cache = DeviceCacheAccess(layout, self.tensors.backing, self.tensors.states)
        context = ConnectorContext(layout, fingerprint, NUM_BLOCKS, NUM_SLOTS)
        pair: KVConnectorPair = create_connector(
            parse_kv_transfer_config(config, layout.block_size), context
        )
        self.scheduler, self.worker = pair.scheduler, pair.worker
        self.worker.register_kv_caches(self.cache)
        track(self)  # the worker's threads and tiers end with the test

    def close(self) -> None:
        self.worker.shutdown()

    def file_worker(self) -> FileConnectorWorker:
        worker: Any = self.worker
        while not isinstance(worker, FileConnectorWorker):
            worker = worker.inner
        return worker

    def save_prompt(self, request: FakeRequest, blocks: RequestBlocks, chunks: list[int]) -> None:
        """Compute the prompt in chunks ending at ``chunks`` and save after each step."""
        start = 0
        for end in chunks:
            meta = self.scheduler.build_connector_meta([(request, start, end, blocks)])
            self.worker.save(meta)
            start = end
        assert self.file_worker().wait_for_saves(5.0)

    def load(
        self, request: FakeRequest, blocks: RequestBlocks, local: int = 0
    ) -> tuple[int, bool, ConnectorMetadata]:
        """Lookup, allocate (``blocks`` given), build metadata, start the load."""
        found = self.scheduler.get_num_new_matched_tokens(request, local)
        assert found is not None
        num_external, is_async = found
        request.num_computed_tokens = local + num_external
        self.scheduler.update_state_after_alloc(request, blocks, num_external)
        meta = self.scheduler.build_connector_meta([])
        self.worker.start_load(meta)
        return num_external, is_async, meta

    def finish(self, *request_ids: str, timeout: float = 5.0) -> KVConnectorOutput:
        """Collect ``get_finished`` outputs until every ``request_ids`` finished receiving."""
        total = KVConnectorOutput()
        deadline = time.monotonic() + timeout
        while not set(request_ids) <= total.finished_recving:
            assert time.monotonic() < deadline, "load did not finish"
            self.worker.wait_for_progress(0.05)
            merge(total, self.worker.get_finished([]))
        return total

    def blocks_bytes(self, block_ids: list[int]) -> torch.Tensor:
        return self.cache.read_blocks(block_ids)

    def state_bytes(self, slot: int) -> torch.Tensor:
        return torch.cat([self.cache.read_state(g, slot) for g in self.layout.state_group_ids])


def merge(into: KVConnectorOutput, other: KVConnectorOutput) -> None:
    into.finished_recving |= other.finished_recving
    into.failed_recving.update(other.failed_recving)
    into.invalid_block_ids.update(other.invalid_block_ids)
    into.invalid_state.update(other.invalid_state)


def table(
    layout: KVCacheLayout, tables: dict[int, list[int]], slots: dict[int, int] | None = None
) -> RequestBlocks:
    """``RequestBlocks`` from per-group tables (attention groups) and live slots (state groups)."""
    ids = tuple(tables[g] for g in layout.attention_group_ids)
    live = tuple((slots or {})[g] for g in layout.state_group_ids)
    return RequestBlocks(ids, live)


def stored_files(root: Path) -> list[Path]:
    """Stored parts under ``root`` (not the disk tier's key and budget files)."""
    return sorted(
        p for p in root.rglob("*") if p.is_file() and p.name not in (".hybridkv-key", "budget")
    )
