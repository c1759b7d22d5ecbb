"""``KVEventCollector``: one step's cache changes as one ``KVEventBatch`` in vLLM's schema.

Sources, each drained once per step on the engine thread::

    device   KVCacheCoordinator.take_events()   per (block hash, group): stored / removed / cleared
    tiers    TierEvent sink (any thread)         per restore unit and tier: stored / removed

A device block is announced with its group (``group_idx``, the spec kind, the window), its
tokens and its parent hash, read from the request that cached it; consecutive blocks of one
request and group share one ``BlockStored`` (vLLM's shape: ``parent_block_hash`` is the
first block's parent, ``token_ids`` every block's tokens). A tier unit holds every group's
part, so tier events carry no group; ``block_hashes`` is the unit's key (the block hash at its
end), ``block_size`` the tokens it spans, ``token_ids`` empty -- as vLLM's offloading
connector reports its units.

Token ids leave the process only for requests without a cache salt: a salted request's
blocks are announced by hash alone (``token_ids=[]``, still vLLM's schema), and with
``omit_token_ids`` every request's are.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable

from hybridkv.connectors.base import BaseConnectorScheduler
from hybridkv.connectors.offloading.tier_registry import tier_medium
from hybridkv.connectors.tier_events import TierEvent
from hybridkv.kv.block_pool import EventKind
from hybridkv.kv.events import CacheEvent, HasBlockHashes
from hybridkv.kv.hashing import BlockHash
from hybridkv.kv.spec import KVCacheLayout, SlidingWindowSpec
from hybridkv.kv_events.config import KVEventsConfig
from hybridkv.kv_events.publisher import EventPublisher, create_publisher
from hybridkv.kv_events.schema import (
    KIND_STATE,
    MEDIUM_DEVICE,
    SPEC_KIND,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEventBatch,
    WireEvent,
)
from hybridkv.kv_events.stats import PublisherStats


class KVEventCollector:
    def __init__(
        self, layout: KVCacheLayout, publisher: EventPublisher, omit_token_ids: bool = False
    ) -> None:
        self.layout = layout
        self.block_size = layout.block_size
        self.publisher = publisher
        self.omit_token_ids = omit_token_ids  # salted requests' token ids are omitted anyway
        self._tier_events: deque[TierEvent] = deque()  # appended on any thread
        # held while draining the tier queue into a published batch (the engine thread per
        # step, the publisher thread while the engine idles): batches keep the queue's order
        self._lock = threading.Lock()
        self._kinds = [SPEC_KIND[g.kind] for g in layout.groups]
        self._windows = [
            g.spec.sliding_window if isinstance(g.spec, SlidingWindowSpec) else None
            for g in layout.groups
        ]
        self._run: tuple[int, str, int] | None = (
            None  # (group, request id, block index) of the last stored
        )

    def on_tier_event(self, event: TierEvent) -> None:
        """The connector's sink: thread-safe (a deque append), never blocks."""
        self._tier_events.append(event)

    def publish_step(self, cache_events: list[CacheEvent]) -> None:
        """Publish this step's changes as one batch (nothing if there were none)."""
        with self._lock:
            events = self._device_events(cache_events)
            events += self._tier_wire_events(self._take_tier_events())
            self._publish(events)

    def pump_tier_events(self) -> None:
        """Publish the tier events queued since the last batch: the publisher thread calls
        this at every poll, so units stored while the engine idles (write-behind) are
        announced without waiting for a step."""
        if self._tier_events:
            with self._lock:
                self._publish(self._tier_wire_events(self._take_tier_events()))

    def flush(self, timeout: float) -> bool:
        """Publish queued tier events and wait until every batch reached the socket."""
        self.pump_tier_events()
        return self.publisher.flush(timeout)

    def publish_reset(self, resident_units: Callable[[], list[TierEvent]]) -> None:
        """After a reset: ``AllBlocksCleared`` then what the tiers still hold, so a subscriber
        that clears everything and one that clears the device only both end right. Tier
        events queued before the snapshot are superseded by it."""
        with self._lock:
            self._take_tier_events()
            events: list[WireEvent] = [AllBlocksCleared()]
            events += self._tier_wire_events(resident_units())
            self._publish(events)

    def publish_units(self, units: list[TierEvent]) -> None:
        """Announce units the tiers held before the sink was set (disk units found at start)."""
        with self._lock:
            self._publish(self._tier_wire_events(units))

    def stats(self) -> PublisherStats:
        return self.publisher.stats()

    @property
    def last_seq(self) -> int:
        """The sequence number of the last batch published (-1: none): an answer's
        ``usage.kv_events_seq``, so a router knows which events cover it."""
        return self.publisher.last_seq

    def _publish(self, events: list[WireEvent]) -> None:
        if events:
            self.publisher.publish(
                KVEventBatch(ts=time.time(), events=events, data_parallel_rank=0)
            )

    def _take_tier_events(self) -> list[TierEvent]:
        out, queue = [], self._tier_events
        for _ in range(len(queue)):
            out.append(queue.popleft())
        return out

    # -- device ----------------------------------------------------------------------------

    def _device_events(self, cache_events: list[CacheEvent]) -> list[WireEvent]:
        out: list[WireEvent] = []
        self._run = None
        for ev in cache_events:
            if ev.kind is EventKind.CLEARED:
                out.append(AllBlocksCleared())
                self._run = None
            elif ev.key is None:
                continue
            elif ev.kind is EventKind.STORED:
                self._add_stored(out, ev.key[0], ev.key[1], ev.request)
            else:
                self._add_removed(out, ev.key[0], ev.key[1], MEDIUM_DEVICE)
        return out

    def _add_stored(
        self, out: list[WireEvent], block_hash: BlockHash, group: int, req: HasBlockHashes | None
    ) -> None:
        index = self._find(req, block_hash, group)
        # fail closed: a request that cannot say it is unsalted publishes no tokens
        hidden = self.omit_token_ids or getattr(req, "salted", True) is not False
        tokens = [] if hidden else _block_tokens(req, index, self.block_size)
        last = out[-1] if out else None
        run = (group, req.request_id, index - 1) if req is not None and index is not None else None
        if isinstance(last, BlockStored) and run is not None and run == self._run:
            last.block_hashes.append(block_hash)
            last.token_ids.extend(tokens)
            if last.extra_keys is not None:
                last.extra_keys.append(None)  # a salt keys block 0 only
            if last.state_checkpoint_ends is not None and index is not None:
                last.state_checkpoint_ends.append((index + 1) * self.block_size)
        else:
            parent = req.block_hashes[index - 1] if req is not None and index else None
            event = self._stored(block_hash, parent, tokens, group)
            self._annotate(event, req, index)
            out.append(event)
        self._run = (
            (group, req.request_id, index) if req is not None and index is not None else None
        )

    def _annotate(self, event: BlockStored, req: HasBlockHashes | None, index: int | None) -> None:
        """vLLM 0.32's ``extra_keys`` (the salt on block 0; not with ``omit_token_ids``) and,
        for a state group, the checkpoint's length (hybridkv's extension)."""
        salt = getattr(req, "cache_salt", None)
        if index == 0 and isinstance(salt, str) and not self.omit_token_ids:
            event.extra_keys = [(salt,)]
        if index is not None and self._kinds[event.group_idx or 0] == KIND_STATE:
            event.state_checkpoint_ends = [(index + 1) * self.block_size]

    def _find(self, req: HasBlockHashes | None, block_hash: BlockHash, group: int) -> int | None:
        """The block's index in ``req``: the one after the last stored block of the same run,
        else searched from the end (new blocks are last), so a step costs its new blocks."""
        if req is None:
            return None
        hashes, run = req.block_hashes, self._run
        if run is not None and run[:2] == (group, req.request_id):
            nxt = run[2] + 1
            if nxt < len(hashes) and hashes[nxt] == block_hash:
                return nxt
        for i in range(len(hashes) - 1, -1, -1):
            if hashes[i] == block_hash:
                return i
        return None

    def _stored(
        self, block_hash: BlockHash, parent: BlockHash | None, tokens: list[int], group: int
    ) -> BlockStored:
        return BlockStored(
            block_hashes=[block_hash],
            parent_block_hash=parent,
            token_ids=tokens,
            block_size=self.block_size,
            lora_id=None,
            medium=MEDIUM_DEVICE,
            lora_name=None,
            group_idx=group,
            kv_cache_spec_kind=self._kinds[group],
            kv_cache_spec_sliding_window=self._windows[group],
        )

    def _add_removed(
        self, out: list[WireEvent], block_hash: BlockHash, group: int | None, medium: str
    ) -> None:
        self._run = None
        last = out[-1] if out else None
        if isinstance(last, BlockRemoved) and last.group_idx == group and last.medium == medium:
            last.block_hashes.append(block_hash)
        else:
            out.append(BlockRemoved(block_hashes=[block_hash], medium=medium, group_idx=group))

    # -- tiers -----------------------------------------------------------------------------

    def _tier_wire_events(self, tier_events: list[TierEvent]) -> list[WireEvent]:
        out: list[WireEvent] = []
        for ev in tier_events:
            medium = tier_medium(ev.tier)  # the tier's registry entry
            if not ev.stored:
                self._add_removed(out, ev.unit_hash, None, medium)
                continue
            last = out[-1] if out else None
            if (
                isinstance(last, BlockStored)
                and last.medium == medium
                and last.block_size == ev.num_tokens
                and ev.parent is not None
                and last.block_hashes[-1] == ev.parent
            ):
                last.block_hashes.append(ev.unit_hash)
                continue
            out.append(
                BlockStored(
                    block_hashes=[ev.unit_hash],
                    parent_block_hash=ev.parent,
                    token_ids=[],
                    block_size=ev.num_tokens,
                    lora_id=None,
                    medium=medium,
                    lora_name=None,
                )
            )
        return out


def _block_tokens(req: HasBlockHashes | None, index: int | None, block_size: int) -> list[int]:
    tokens: list[int] | None = getattr(req, "all_token_ids", None)
    if tokens is None or index is None:
        return []
    return list(tokens[index * block_size : (index + 1) * block_size])


def create_collector(
    config: KVEventsConfig | None, layout: KVCacheLayout, connector: BaseConnectorScheduler | None
) -> KVEventCollector | None:
    """The engine's collector (None when events are off); binds the publisher's endpoint and
    announces what the connector's tiers hold already."""
    if config is None or not config.enabled:
        return None
    collector = KVEventCollector(layout, create_publisher(config), config.omit_token_ids)
    collector.publisher.set_poll_hook(collector.pump_tier_events)
    tiers = connector.capabilities().tiers if connector is not None else None
    if tiers is not None:
        tiers.set_tier_event_sink(collector.on_tier_event)
        collector.publish_units(tiers.resident_units())
    return collector
