"""The NixlConnector's scheduler half: what a producer keeps and advertises (``producer``:
staging entries, leases, signed params), what a consumer reads (here: its producer's params
parsed once, load specs). Never touches memory; see ``plan`` for the token arithmetic.

Consumer (request with the producer's params, ``do_remote_prefill``)::

    lookup: E - local hit tokens, asynchronous  ->  allocation  ->  LoadSpec (keys: RemoteSource)
    a full local hit or an abort before the read  ->  NotifyOnly (the producer frees at once)
    waiting for admission (on_waiting)  ->  Heartbeat per producer every interval (``heartbeats``)
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from hybridkv.connectors.base import (
    BaseConnectorScheduler,
    KeptKV,
    KVConnectorRequest,
    RequestBlocks,
)
from hybridkv.connectors.nixl.heartbeats import WaitList
from hybridkv.connectors.nixl.layout import GroupDesc
from hybridkv.connectors.nixl.meta import (
    NixlItem,
    NotifyOnly,
    ParamsPolicy,
    ParamsRefused,
    RemoteSource,
    StageState,
    StartLease,
)
from hybridkv.connectors.nixl.options import NixlOptions
from hybridkv.connectors.nixl.plan import first_whole_entries
from hybridkv.connectors.nixl.producer import Producer, cdiv
from hybridkv.connectors.nixl.stats import NixlStats
from hybridkv.connectors.stats import StatsCounter, bump
from hybridkv.request import RequestStatus
from hybridkv.step_io import ConnectorMetadata, KVConnectorOutput, LoadSpec

log = logging.getLogger(__name__)


_NORMAL_FINISH = (RequestStatus.FINISHED_STOPPED, RequestStatus.FINISHED_LENGTH)


class NixlScheduler(BaseConnectorScheduler):
    def __init__(
        self,
        options: NixlOptions,
        engine_id: str,
        groups: tuple[GroupDesc, ...],
        block_size: int,
        producer: bool,
        consumer: bool,
        policy: ParamsPolicy,
    ) -> None:
        self.options = options
        self.policy = policy  # the deployment key: verifies a producer's params
        self.stats = StatsCounter(NixlStats)  # params refused
        self._sources: dict[str, RemoteSource | None] = {}  # consumer: params parsed once
        self.block_size = block_size
        self.attn = [g for g in groups if g.token_bytes]
        self.has_state = any(not g.token_bytes for g in groups)
        self.consumer = consumer
        self.producer = None
        if producer:
            self.producer = Producer(options, engine_id, groups, block_size, policy)
        self._consumed: set[str] = set()
        self._whole: dict[str, tuple[int, ...]] = {}  # a load's first whole entries, once
        self._loads: list[LoadSpec[RemoteSource]] = []
        self._items: list[NixlItem] = []
        interval = options.heartbeat_interval_seconds
        self.waits = None
        if consumer and interval > 0:
            self.waits = WaitList(interval, self._source, self._consumed)

    # -- which role a request plays --------------------------------------------------------

    def _end_if_producing(self, request: KVConnectorRequest) -> int | None:
        return self.producer.end_of(request) if self.producer is not None else None

    def _source(self, request: KVConnectorRequest, to_load: bool = True) -> RemoteSource | None:
        """A consumer's request's producer, parsed and verified once (at first sight, so the
        expiry is judged on arrival); None if it has none or its params are refused (counted,
        logged; the request computes locally). ``to_load`` False: only to tell the producer to
        free (the prompt is not checked, nothing is kept)."""
        fields = request.transfer_fields
        if not (self.consumer and fields and fields.do_remote_prefill):
            return None
        rid = request.request_id
        if rid in self._sources:
            return self._sources[rid]
        src = None
        try:
            layout = (len(self.attn), self.has_state)
            tokens = request.all_token_ids if to_load else None
            src = RemoteSource.parse(fields, tokens, layout, self.policy)
        except ParamsRefused as exc:
            with self.stats.update() as s:
                bump(s.failures, exc.reason)
            log.warning("request %s: %s: %s; computing it locally", rid, exc.reason, exc)
        if to_load:
            self._sources[rid] = src
        return src

    # -- consumer ----------------------------------------------------------------------------

    def on_waiting(self, requests: Sequence[KVConnectorRequest]) -> None:
        if self.waits is not None:
            self.waits.update(requests)

    def get_num_new_matched_tokens(
        self, request: KVConnectorRequest, num_local_computed: int
    ) -> tuple[int, bool] | None:
        src = None if request.request_id in self._consumed else self._source(request)
        if src is None or src.num_tokens <= num_local_computed:
            return 0, False
        return src.num_tokens - num_local_computed, True

    def update_state_after_alloc(
        self, request: KVConnectorRequest, blocks: RequestBlocks, num_external_tokens: int
    ) -> None:
        if self.waits is not None:
            self.waits.stop(request.request_id)  # its load starts, or it computes locally
        src = None if request.request_id in self._consumed else self._source(request)
        if src is None:
            return
        self._consumed.add(request.request_id)
        if num_external_tokens == 0:
            if src.num_tokens > 0:
                self._items.append(NotifyOnly(src))
            return
        end = request.num_computed_tokens
        start = end - num_external_tokens
        self._loads.append(self._load_spec(request.request_id, blocks, start, end, src))
        self._whole[request.request_id] = first_whole_entries(
            self.attn, src.first_blocks, src.block_size, (start, end), self.block_size
        )

    def _load_spec(
        self, request_id: str, blocks: RequestBlocks, start: int, end: int, src: RemoteSource
    ) -> LoadSpec[RemoteSource]:
        ids, indices = [], []
        first, last = start // self.block_size, cdiv(end, self.block_size)
        for table in blocks.block_ids:
            picked = [(k, table[k]) for k in range(first, min(last, len(table))) if table[k]]
            indices.append([k for k, _ in picked])
            ids.append([b for _, b in picked])
        return LoadSpec(
            request_id, start, end, tuple(ids), tuple(indices), blocks.state_slots, True, src
        )

    def get_hit_sources(
        self, request: KVConnectorRequest, num_external_tokens: int
    ) -> dict[str, int]:
        return {"nixl": num_external_tokens} if num_external_tokens else {}

    def get_first_whole_blocks(
        self, request: KVConnectorRequest, num_external_tokens: int
    ) -> tuple[int, ...] | None:
        """Per attention group, where the load's whole entries start (``first_whole_entries``,
        computed with the load)."""
        return self._whole.pop(request.request_id, None)

    # -- producer ----------------------------------------------------------------------------

    def get_step_interval(self, request: KVConnectorRequest) -> int:
        """A producer's prefill stops at E once, so the live state there can be staged."""
        end = self._end_if_producing(request)
        return end if end and self.has_state else 0

    def build_connector_meta(
        self, scheduled: list[tuple[KVConnectorRequest, int, int, RequestBlocks]]
    ) -> ConnectorMetadata[RemoteSource, NixlItem]:
        items = self._items
        if self.waits is not None:
            items.extend(self.waits.due())
        for request, start, end, blocks in scheduled:
            stage_at = self._end_if_producing(request)
            if not (self.has_state and stage_at) or self.producer is None:
                continue
            if end == stage_at:  # the live state after this step's forward
                slots = blocks.state_slots
            elif start == stage_at and blocks.restored_slots is not None:
                slots = blocks.restored_slots  # a local hit at E: the restored checkpoint
            else:
                continue
            index = self.producer.stage_index(request.request_id)
            if index is not None:
                items.append(StageState(request.request_id, index, slots))
        meta = ConnectorMetadata(loads=self._loads, saves=items)
        self._loads, self._items = [], []
        return meta

    def request_finished(
        self, request: KVConnectorRequest, blocks: RequestBlocks
    ) -> tuple[bool, dict[str, object] | None]:
        rid = request.request_id
        self._consumer_done(request)
        producer = self.producer
        end = producer.end_of(request) if producer is not None else None
        if producer is None or end is None:
            return False, None
        if request.status not in _NORMAL_FINISH:
            producer.release_staging(rid)
            return False, None
        if self.has_state and not producer.is_staged(rid):
            end = 0  # its state at E was never staged (no staging entry free): recompute
        lease = producer.new_lease(rid) if end > 0 else None
        if lease is None:
            producer.release_staging(rid)
            return False, producer.params(request, blocks, 0)
        self._items.append(StartLease(rid, self.options.abort_timeout_seconds, lease))
        return True, producer.params(request, blocks, end)

    def request_dropped(self, request: KVConnectorRequest) -> None:
        """Aborted (or failed) while waiting for admission: its producer frees now instead of
        holding the KV for ``abort_timeout_seconds``."""
        self._consumer_done(request)

    def has_pending(self) -> bool:
        return bool(self._items)

    def _consumer_done(self, request: KVConnectorRequest) -> None:
        """A request ends: if it never read its producer's KV, tell the producer (NotifyOnly)."""
        rid = request.request_id
        self._whole.pop(rid, None)
        if self.waits is not None:
            self.waits.stop(rid)
        if rid in self._consumed:
            self._consumed.discard(rid)
            self._sources.pop(rid, None)
            return
        src = self._source(request, to_load=False)
        self._sources.pop(rid, None)
        if src is not None and src.num_tokens > 0:  # aborted before its read started
            self._items.append(NotifyOnly(src))

    def get_kept_kv(self, request: KVConnectorRequest) -> KeptKV | None:
        return self.producer.kept_kv(request) if self.producer is not None else None

    def take_stats(self) -> NixlStats:
        return self.stats.take()  # params refused; the worker half counts the rest

    def update_connector_output(self, output: KVConnectorOutput) -> None:
        if self.producer is not None:
            for rid in output.finished_sending:
                self.producer.sent(rid)
