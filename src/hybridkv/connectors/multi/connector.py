"""``MultiConnector``: several connectors as one; each request loads from one chosen child,
saves go to every child.

Config (``kv_connector_extra_config``, parsed in ``multi.config``): a list of child
``kv_transfer_config`` objects and a ``selection``. Children are created in order with the
parent's role; ``load_weight`` (default 1.0) and ``name`` (default
``<index>.<kv_connector>``, the ``connector`` label of their counters) are read there.
``selection`` is ``first``, ``weighted`` or ``cost`` (``multi.select``).

The scheduler half asks every child, picks one among those that answered
(``multi.select.choose``) and asks again later (``None``) only if a child still looking could
beat that pick (``multi.select.worth_waiting``: never after a full hit); it gives the chosen
child the real external count in ``update_state_after_alloc`` and every other child 0. Metadata is one ``ConnectorMetadata`` per child (``MultiMetadata``);
each child plans its own saves, with its own backpressure. Step intervals: their gcd. The
time from a load's metadata to its ``finished_recving`` feeds the chosen child's estimate;
the time between steps over the tokens they computed feeds the prefill estimate.

Counters: the children's, summed under their own names, and each again as
``connector.<name>.<counter>``, plus ``selected.<name>`` / ``selected_tokens.<name>`` and
``waited.<name>`` (lookups asked again because that child was still looking).
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass

from hybridkv.connectors.base import (
    BaseConnectorScheduler,
    Capabilities,
    KeptKV,
    KVConnectorPair,
    KVConnectorRequest,
    PartialKV,
    RequestBlocks,
)
from hybridkv.connectors.config import KVTransferConfig
from hybridkv.connectors.multi.config import MultiConfig
from hybridkv.connectors.multi.select import (
    Hit,
    LoadEstimate,
    PrefillEstimate,
    choose,
    load_bytes,
    worth_waiting,
)
from hybridkv.connectors.multi.worker import (
    MultiConnectorWorker,
    MultiMetadata,
    MultiStats,
    merge_child_stats,
)
from hybridkv.connectors.registry import (
    ConnectorContext,
    create_connector,
)
from hybridkv.connectors.stats import ConnectorStats, bump
from hybridkv.connectors.tier_events import TierEvent, TierEventSink
from hybridkv.kv.block_pool import NULL_BLOCK
from hybridkv.kv.spec import KVCacheLayout
from hybridkv.step_io import ConnectorMetadata, KVConnectorOutput


@dataclass(slots=True)
class _Loading:
    child: int
    nbytes: int
    started: float | None = None  # when its metadata went out


@dataclass(slots=True)
class _Clock:
    last: float | None = None  # when the previous step's metadata was built
    tokens: int = 0  # tokens that step computed


class MultiConnectorScheduler(BaseConnectorScheduler):
    def __init__(
        self,
        config: MultiConfig,
        children: list[BaseConnectorScheduler],
        layout: KVCacheLayout,
        estimates: list[LoadEstimate] | None = None,
        prefill: PrefillEstimate | None = None,
    ) -> None:
        self.config = config
        self.children = children
        self.layout = layout
        self.names = [c.name for c in config.children]
        self.weights = [c.load_weight for c in config.children]
        self.estimates = estimates or [LoadEstimate() for _ in children]
        self.prefill = prefill or PrefillEstimate()
        self.clock = time.monotonic
        caps = [child.capabilities() for child in children]  # resolved once
        self._partial_of = [c.partial for c in caps]
        self._tiers = [c.tiers for c in caps if c.tiers is not None]
        self._leases = [c.leases for c in caps if c.leases is not None]
        self._chosen: dict[str, Hit] = {}  # request id -> the child loading it
        self._loading: dict[str, _Loading] = {}
        self._delaying: dict[str, list[PartialKV | None]] = {}  # children keeping its KV
        # request id -> per group, table entries [first, stop) its load filled only in part
        self._partial: dict[str, tuple[range, ...]] = {}
        self._steps = _Clock()
        self._stats = MultiStats()

    def get_num_new_matched_tokens(
        self, request: KVConnectorRequest, num_local_computed: int
    ) -> tuple[int, bool] | None:
        """Every child is asked; the best answer is taken unless a child still looking could
        beat it (``worth_waiting``): then ask again (None)."""
        hits: list[Hit] = []
        pending: list[int] = []
        for i, child in enumerate(self.children):
            found = child.get_num_new_matched_tokens(request, num_local_computed)
            if found is None:
                pending.append(i)
            else:
                hits.append(Hit(i, found[0], found[1]))
        todo = request.num_tokens - num_local_computed
        args = (self.weights, self.estimates, self.prefill, self.layout, todo)
        pick = choose(self.config.selection, hits, *args)
        max_hit = max(0, request.num_tokens - 1 - num_local_computed)
        if worth_waiting(self.config.selection, pick, pending, *args, max_hit):
            for i in pending:
                bump(self._stats.waited, self.names[i])
            self._chosen.pop(request.request_id, None)
            return None
        if pick is None:
            self._chosen.pop(request.request_id, None)
            return 0, False
        self._chosen[request.request_id] = pick
        return pick.tokens, pick.is_async

    def update_state_after_alloc(
        self, request: KVConnectorRequest, blocks: RequestBlocks, num_external_tokens: int
    ) -> None:
        self._partial.pop(request.request_id, None)  # a new admission (after a restart)
        pick = self._chosen.get(request.request_id)
        chosen = pick.child if pick is not None and num_external_tokens > 0 else -1
        for i, child in enumerate(self.children):
            child.update_state_after_alloc(
                request, blocks, num_external_tokens if i == chosen else 0
            )
        if chosen >= 0:
            name = self.names[chosen]
            bump(self._stats.selected, name)
            bump(self._stats.selected_tokens, name, num_external_tokens)
            nbytes = load_bytes(self.layout, num_external_tokens)
            self._loading[request.request_id] = _Loading(chosen, nbytes)

    def get_first_whole_blocks(
        self, request: KVConnectorRequest, num_external_tokens: int
    ) -> tuple[int, ...] | None:
        """The loading child's answer; the entries it filled in part are hidden (null) from
        every child's saves (``build_connector_meta``), so no tier stores them as held."""
        pick = self._chosen.get(request.request_id)
        if pick is None or not num_external_tokens:
            return None
        partial = self._partial_of[pick.child]
        if partial is None:
            return None
        whole = partial.get_first_whole_blocks(request, num_external_tokens)
        if whole is not None:
            first = (request.num_computed_tokens - num_external_tokens) // self.layout.block_size
            parts = tuple(range(first, max(first, stop)) for stop in whole)
            if any(parts):
                self._partial[request.request_id] = parts
        return whole

    def get_hit_sources(
        self, request: KVConnectorRequest, num_external_tokens: int
    ) -> dict[str, int]:
        pick = self._chosen.pop(request.request_id, None)
        if pick is None:
            return {}
        return self.children[pick.child].get_hit_sources(request, num_external_tokens)

    def get_step_interval(self, request: KVConnectorRequest) -> int:
        intervals = [c.get_step_interval(request) for c in self.children]
        return math.gcd(*[i for i in intervals if i > 0]) if any(intervals) else 0

    def capabilities(self) -> Capabilities:
        """Tiers if a child has some; the lease and partial-KV hooks always (this half keeps
        per-request state they clear; each goes on to the children that have them)."""
        return Capabilities(self if self._tiers else None, self, self)

    # -- tiers: the children's, together (two offloading children would both report "CPU") --

    def set_tier_event_sink(self, sink: TierEventSink) -> None:
        for tiers in self._tiers:
            tiers.set_tier_event_sink(sink)

    def resident_units(self) -> list[TierEvent]:
        return [unit for tiers in self._tiers for unit in tiers.resident_units()]

    def reset_tiers(self) -> int:
        return sum(tiers.reset_tiers() for tiers in self._tiers)

    def build_connector_meta(
        self, scheduled: list[tuple[KVConnectorRequest, int, int, RequestBlocks]]
    ) -> ConnectorMetadata:
        now = self.clock()
        self._measure_step(now, sum(end - start for _, start, end, _ in scheduled))
        if self._partial:
            scheduled = [(r, s, e, self._saveable(r.request_id, b)) for r, s, e, b in scheduled]
        metas = tuple(child.build_connector_meta(scheduled) for child in self.children)
        for meta in metas:
            for spec in meta.loads:
                loading = self._loading.get(spec.request_id)
                if loading is not None and loading.started is None:
                    loading.started = now
        return MultiMetadata(loads=[spec for meta in metas for spec in meta.loads], children=metas)

    def _saveable(self, request_id: str, blocks: RequestBlocks) -> RequestBlocks:
        """``blocks`` with the entries its load filled only in part shown as null."""
        parts = self._partial.get(request_id)
        if parts is None:
            return blocks
        tables = tuple(list(t) for t in blocks.block_ids)
        for table, part in zip(tables, parts, strict=True):
            for k in part:
                if k < len(table):
                    table[k] = NULL_BLOCK
        return dataclasses.replace(blocks, block_ids=tables)

    def _measure_step(self, now: float, tokens: int) -> None:
        """The previous step's tokens over the time until this one: the prefill estimate."""
        if self._steps.last is not None:
            self.prefill.add(self._steps.tokens, now - self._steps.last)
        self._steps.last, self._steps.tokens = now, tokens

    def on_waiting(self, requests: Sequence[KVConnectorRequest]) -> None:
        for leases in self._leases:
            leases.on_waiting(requests)

    def request_dropped(self, request: KVConnectorRequest) -> None:
        self._chosen.pop(request.request_id, None)
        self._partial.pop(request.request_id, None)
        self._loading.pop(request.request_id, None)
        for leases in self._leases:
            leases.request_dropped(request)

    def has_pending(self) -> bool:
        return any(child.has_pending() for child in self.children)

    def update_connector_output(self, output: KVConnectorOutput) -> None:
        now = self.clock()
        done = output.finished_recving | set(output.failed_recving)
        for rid in done:
            loading = self._loading.pop(rid, None)
            if loading is None or loading.started is None:
                continue
            if rid not in output.failed_recving:
                self.estimates[loading.child].add(loading.nbytes, now - loading.started)
        for child in self.children:
            child.update_connector_output(output)

    def request_finished(
        self, request: KVConnectorRequest, blocks: RequestBlocks
    ) -> tuple[bool, dict[str, object] | None]:
        self._chosen.pop(request.request_id, None)
        self._loading.pop(request.request_id, None)
        self._partial.pop(request.request_id, None)
        params: dict[str, object] | None = None
        delaying = []
        for child, partial in zip(self.children, self._partial_of, strict=True):
            child_delay, child_params = child.request_finished(request, blocks)
            if child_delay:
                delaying.append(partial)
            if child_params:
                params = {**(params or {}), **child_params}
        if delaying:
            self._delaying[request.request_id] = delaying
        return bool(delaying), params

    def get_kept_kv(self, request: KVConnectorRequest) -> KeptKV | None:
        """What every child that delayed the free keeps, together: the longest prefix, the
        earliest window; None (everything) if one of them keeps everything."""
        delaying = self._delaying.pop(request.request_id, [])
        kept = [p.get_kept_kv(request) if p is not None else None for p in delaying]
        if not kept or any(k is None for k in kept):
            return None
        return KeptKV(
            max(k.num_tokens for k in kept if k is not None),
            min(k.window_at for k in kept if k is not None),
        )

    def take_stats(self) -> ConnectorStats:
        stats, self._stats = self._stats, MultiStats()
        merge_child_stats(stats, self.names, [c.take_stats() for c in self.children])
        return stats


def create_multi_connector(config: KVTransferConfig, context: ConnectorContext) -> KVConnectorPair:
    multi = config.options_as(MultiConfig)
    pairs = []
    for child in multi.children:
        child_config = child.config
        if not child.role_given:
            child_config = dataclasses.replace(child_config, kv_role=config.kv_role)
        try:
            pairs.append(create_connector(child_config, context))
        except ValueError as exc:
            for created in pairs:  # their threads end with this error
                created.worker.shutdown()
            raise ValueError(
                f"MultiConnector: child {child.name!r} ({child.config.kv_connector}) cannot "
                f"serve this engine's layout or config: {exc}"
            ) from None
    scheduler = MultiConnectorScheduler(multi, [p.scheduler for p in pairs], context.layout)
    worker = MultiConnectorWorker([c.name for c in multi.children], [p.worker for p in pairs])
    return KVConnectorPair(scheduler, worker)
