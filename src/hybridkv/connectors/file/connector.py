"""``FileConnector``: prompt KV stored per group in files of a directory, loaded back on a hit.

Config (``kv_connector_extra_config``)::

    {"path": DIR (required), "load_mode": "async" | "sync" (default "async"), "save": true,
     "load_timeout_seconds": 30.0}

The scheduler half (here) decides from the store's index; the worker half
(``file/worker.py``) reads and writes the files (``file/format.py``). A hit at T is reported only
when every group has what a resume at T needs (architecture principle 5)::

    tokens   0 ........ L ................. T ........ N
             | local hit | loaded from files | computed |
    full     .           [ blocks L/B .. T/B ) all stored
    sliding  .           .   [ window ending at T, from max(L, T-W+1) )
    state    .           .                   ^ a .state file at exactly T
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from hybridkv.choice import parse_choice
from hybridkv.connectors.base import (
    BaseConnectorScheduler,
    KVConnectorPair,
    KVConnectorRequest,
    RequestBlocks,
)
from hybridkv.connectors.config import (
    ConnectorOptions,
    KVTransferConfig,
    LoadMode,
    OptionsContext,
    parse_number,
)
from hybridkv.connectors.file.stats import FileStats
from hybridkv.connectors.file.store import (
    FileLoadKeys,
    FileSave,
    FileStore,
    block_key,
    state_key,
)
from hybridkv.connectors.registry import ConnectorContext
from hybridkv.kv.hashing import BlockHash
from hybridkv.kv.spec import KVCacheLayout, SlidingWindowSpec, SpecKind
from hybridkv.step_io import ConnectorMetadata, LoadSpec

MAX_LOAD_TIMEOUT_SECONDS = 3600.0


@dataclass(frozen=True, slots=True)
class FileConnectorConfig(ConnectorOptions):
    path: str
    load_mode: LoadMode = LoadMode.ASYNC
    save: bool = True
    load_timeout_seconds: float = 30.0  # a load still reading then fails (reason "timeout")

    @classmethod
    def parse(cls, extra: Mapping[str, object], ctx: OptionsContext) -> FileConnectorConfig:
        known = {"path", "load_mode", "save", "load_timeout_seconds"}
        for name in extra:
            if name not in known:
                raise ValueError(
                    f"FileConnector: unknown key {name!r} in kv_connector_extra_config; "
                    f"known: {sorted(known)}"
                )
        path = extra.get("path")
        if not isinstance(path, str | os.PathLike) or not os.fspath(path):
            raise ValueError("FileConnector: 'path' (a directory) is required")
        load_mode = parse_choice(
            LoadMode, extra.get("load_mode", "async"), "FileConnector: 'load_mode'"
        )
        save = extra.get("save", True)
        if not isinstance(save, bool):
            raise ValueError(f"FileConnector: 'save'={save!r} must be true or false")
        timeout = parse_number(
            extra.get("load_timeout_seconds", 30.0),
            "FileConnector: 'load_timeout_seconds'",
            0.0,
            MAX_LOAD_TIMEOUT_SECONDS,
            low_open=True,
        )
        return cls(str(os.fspath(path)), load_mode, save, timeout)


class FileConnectorScheduler(BaseConnectorScheduler):
    def __init__(
        self, layout: KVCacheLayout, store: FileStore, load_async: bool, save: bool, load: bool
    ) -> None:
        self.layout = layout
        self.store = store
        self.load_async = load_async
        self.save_enabled = save
        self.load_enabled = load
        self.block_size = layout.block_size
        self._loads: list[LoadSpec[FileLoadKeys]] = []
        self._stats = FileStats()

    # -- lookup ------------------------------------------------------------------------------

    def get_num_new_matched_tokens(
        self, request: KVConnectorRequest, num_local_computed: int
    ) -> tuple[int, bool]:
        end = self._find_restore_end(request, num_local_computed) if self.load_enabled else 0
        if end <= num_local_computed:
            return 0, False
        return end - num_local_computed, self.load_async

    def _find_restore_end(self, request: KVConnectorRequest, local: int) -> int:
        """The largest boundary T > local at which every group can be restored, else 0."""
        size = self.block_size
        limit = request.num_tokens - 1 if self.layout.state_group_ids else request.num_tokens
        hashes = request.block_hashes
        end = min(limit // size, len(hashes)) * size
        for group in self.layout.groups:
            if group.kind is SpecKind.FULL:
                k = local // size
                while k < end // size and self.store.contains(block_key(group.group_id, hashes[k])):
                    k += 1
                end = min(end, k * size)
        for candidate in range(end, local, -size):
            if self._is_restorable(hashes, local, candidate):
                return candidate
        return 0

    def _is_restorable(self, hashes: list[BlockHash], local: int, end: int) -> bool:
        """Sliding windows and states at ``end`` (full attention was checked by the caller)."""
        size = self.block_size
        for group in self.layout.groups:
            gid, spec = group.group_id, group.spec
            if isinstance(spec, SlidingWindowSpec):
                first = max(local, end - spec.sliding_window + 1) // size
                if not all(
                    self.store.contains(block_key(gid, hashes[k]))
                    for k in range(first, end // size)
                ):
                    return False
            elif group.kind is SpecKind.STATE and not self.store.contains(
                state_key(gid, hashes[end // size - 1])
            ):
                return False
        return True

    # -- loads -------------------------------------------------------------------------------

    def update_state_after_alloc(
        self, request: KVConnectorRequest, blocks: RequestBlocks, num_external_tokens: int
    ) -> None:
        if num_external_tokens <= 0:
            return
        end = request.num_computed_tokens
        start = end - num_external_tokens
        size, hashes = self.block_size, request.block_hashes
        ids: list[list[int]] = []
        indices: list[list[int]] = []
        keys: list[list[str]] = []
        for gid, table in zip(self.layout.attention_group_ids, blocks.block_ids, strict=True):
            picked = [k for k in range(start // size, -(-end // size)) if table[k] != 0]
            ids.append([table[k] for k in picked])
            indices.append(picked)
            keys.append([block_key(gid, hashes[k]) for k in picked])
        state_keys = tuple(
            state_key(g, hashes[end // size - 1]) for g in self.layout.state_group_ids
        )
        self._loads.append(
            LoadSpec(
                request_id=request.request_id,
                start=start,
                end=end,
                block_ids=tuple(ids),
                block_indices=tuple(indices),
                state_slots=tuple(blocks.state_slots),
                is_async=self.load_async,
                keys=FileLoadKeys(tuple(keys), state_keys),
            )
        )
        self._stats.load_requests += 1
        self._stats.load_tokens += num_external_tokens

    # -- saves -------------------------------------------------------------------------------

    def build_connector_meta(
        self, scheduled: list[tuple[KVConnectorRequest, int, int, RequestBlocks]]
    ) -> ConnectorMetadata[FileLoadKeys, FileSave]:
        loads, self._loads = self._loads, []
        saves: list[FileSave] = []
        if self.save_enabled:
            for request, start, end, blocks in scheduled:
                save = self._plan_save(request, start, end, blocks)
                if save is not None:
                    saves.append(save)
        return ConnectorMetadata(loads=loads, saves=saves)

    def _plan_save(
        self, request: KVConnectorRequest, start: int, end: int, blocks: RequestBlocks
    ) -> FileSave | None:
        """Prompt blocks that become full in [start, end), and states when ``end`` is a prompt
        boundary; only what the store does not hold yet."""
        size, hashes = self.block_size, request.block_hashes
        last = min(end, request.num_prompt_tokens) // size  # blocks [first, last) become full
        first = start // size
        save = FileSave(request.request_id, [], [], [], [], [], [], end)
        for gid, table in zip(self.layout.attention_group_ids, blocks.block_ids, strict=True):
            for k in range(first, min(last, len(table), len(hashes))):
                key = block_key(gid, hashes[k])
                if table[k] != 0 and not self.store.contains(key):
                    save.block_ids.append(table[k])
                    save.block_indices.append(k)
                    save.block_keys.append(key)
        if end % size == 0 and 0 < end <= request.num_prompt_tokens and end // size <= len(hashes):
            for gid, slot in zip(self.layout.state_group_ids, blocks.state_slots, strict=True):
                key = state_key(gid, hashes[end // size - 1])
                if not self.store.contains(key):
                    save.state_groups.append(gid)
                    save.state_slots.append(slot)
                    save.state_keys.append(key)
        return save if save.block_ids or save.state_slots else None

    def request_finished(
        self, request: KVConnectorRequest, blocks: RequestBlocks
    ) -> tuple[bool, dict[str, object] | None]:
        return False, None

    def get_hit_sources(
        self, request: KVConnectorRequest, num_external_tokens: int
    ) -> dict[str, int]:
        return {"disk": num_external_tokens} if num_external_tokens else {}

    def take_stats(self) -> FileStats:
        stats, self._stats = self._stats, FileStats()
        return stats


def create_file_connector(config: KVTransferConfig, context: ConnectorContext) -> KVConnectorPair:
    from hybridkv.connectors.file.worker import FileConnectorWorker

    options = config.options_as(FileConnectorConfig)
    try:
        store = FileStore(options.path, context.fingerprint)
    except OSError as exc:  # not a directory, no permission...: a config error, said at start-up
        raise ValueError(
            f"FileConnector: cannot use 'path'={options.path!r} as a KV directory: "
            f"{exc.strerror or exc}"
        ) from None
    scheduler = FileConnectorScheduler(
        context.layout,
        store,
        load_async=options.load_mode is LoadMode.ASYNC,
        save=options.save and config.kv_role.saves,
        load=config.kv_role.loads,
    )
    worker = FileConnectorWorker(
        context.layout, store, load_timeout_seconds=options.load_timeout_seconds
    )
    return KVConnectorPair(scheduler, worker)
