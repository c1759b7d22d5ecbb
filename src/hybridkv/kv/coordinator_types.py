"""The coordinator's seams: what it reads of a request, its config, a hit, its stats.

Plain data only, so the scheduler, the connectors and the tests can build and read them
without a coordinator. ``KVRequest`` is a read-only view: the coordinator never writes a
request. ``CacheHit`` is immutable and only valid until the next ``allocate`` or ``free``
(its block ids and slots are not pinned until ``allocate`` touches them).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from hybridkv.kv.hashing import BlockHash


class KVRequest(Protocol):
    """What the KV core reads of a request (the scheduler's Request satisfies it)."""

    @property
    def request_id(self) -> str: ...
    @property
    def num_tokens(self) -> int: ...
    @property
    def num_prompt_tokens(self) -> int: ...
    @property
    def num_computed_tokens(self) -> int: ...
    @property
    def block_hashes(self) -> list[BlockHash]: ...
    @property
    def cache_boundaries(self) -> tuple[int, ...]: ...


@dataclass(frozen=True, slots=True)
class KVCacheConfig:
    num_blocks: int  # attention blocks, null block included
    num_state_slots: int = 0  # per state group: live, checkpoint and trailing slots
    enable_prefix_caching: bool = True
    state_checkpoint_interval: int = 512  # tokens; 0 = only prompt/junction/finish boundaries
    enable_kv_cache_events: bool = True  # record stored/removed events (someone must drain them)
    # the coordinator drains them itself into per-key events for ``take_events`` (KV events)
    key_events: bool = False
    # checkpoints (pending saves included) per state group; None: bounded by the slots only
    max_checkpoints: int | None = None
    # True: steps run past due boundaries and the scan hands back the states there
    # (``StateCopy.at``); False: steps end at each due boundary
    states_from_scan: bool = False


@dataclass(frozen=True, slots=True)
class CacheHit:
    """A local prefix hit valid in every group: ``num_tokens`` is a restore boundary."""

    num_tokens: int = 0
    block_ids: tuple[tuple[int, ...], ...] = ()  # per attention group (null outside windows)
    state_slots: tuple[int | None, ...] = ()  # checkpoint per state group
    group_hit_tokens: tuple[int, ...] = ()  # each group's own longest hit (stats)
    num_common_prefix_tokens: int = 0  # full-attention hit (> num_tokens: a junction to save)


@dataclass(slots=True)
class PrefixCacheStats:
    num_queries: int = 0
    queried_tokens: int = 0
    hit_tokens: int = 0
    group_hit_tokens: list[int] = field(default_factory=list)
