"""The NixlConnector's worker half: registers the cache once, serves the handshake (producer),
reads remote KV into this engine's blocks and live state slots (consumer), and reports.

A consumer load goes: handshake (background thread, cached per producer) -> descriptor plan
-> one NIXL READ whose notification ``"<remote request id>:<bytes>"`` tells the producer it may
free -> ``finished_recving``; a refused connection, an incompatible layout, a transfer error or
``load_timeout_seconds`` fail the load (``failed_recving``), and the scheduler's recovery
recomputes (or fails the request under policy ``fail``). A producer counts notifications and
expired leases into ``finished_sending``.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from hybridkv.connectors.base import (
    BaseConnectorWorker,
    KVCacheAccess,
    LoadResult,
    output_from_results,
)
from hybridkv.connectors.nixl.agent import NixlAgent, XferState
from hybridkv.connectors.nixl.handshake import HandshakeFailed, Peer, Peers
from hybridkv.connectors.nixl.layout import LayoutDescriptor, TensorDesc, group_descs
from hybridkv.connectors.nixl.leases import Leases
from hybridkv.connectors.nixl.meta import NotifyOnly, RemoteSource, StageState, StartLease
from hybridkv.connectors.nixl.options import NixlOptions
from hybridkv.connectors.nixl.plan import (
    Desc,
    GroupRead,
    attention_descs,
    consumer_range,
    state_descs,
)
from hybridkv.connectors.nixl.side_channel import SideChannelServer
from hybridkv.connectors.nixl.stats import Flow, NixlStats
from hybridkv.connectors.stats import StatsCounter, bump
from hybridkv.kv.spec import KVCacheLayout
from hybridkv.step_io import ConnectorMetadata, KVConnectorOutput, LoadSpec

log = logging.getLogger(__name__)


@dataclass(slots=True)
class _Load:
    spec: LoadSpec
    source: RemoteSource
    started: float
    handle: Any = None
    nbytes: int = 0
    num_descs: int = 0


class NixlWorker(BaseConnectorWorker):
    def __init__(
        self,
        options: NixlOptions,
        layout: KVCacheLayout,
        model_id: str,
        engine_id: str,
        producer: bool,
        compat: str,
    ) -> None:
        self.options = options
        self.layout = layout
        self.engine_id = engine_id
        self.producer = producer
        self.compat = compat
        self.stats = StatsCounter(NixlStats)
        self._loads: list[_Load] = []
        self._notify: list[NotifyOnly] = []
        self._done: list[LoadResult] = []
        self.leases = Leases(self.stats)
        self._server: SideChannelServer | None = None
        self._staging: torch.Tensor | None = None

    # -- start-up ------------------------------------------------------------------------------

    def register_kv_caches(self, cache: KVCacheAccess) -> None:
        super().register_kv_caches(cache)
        backing: list[torch.Tensor] = list(getattr(cache, "backing", []))
        states: dict[int, list[torch.Tensor]] = dict(getattr(cache, "group_states", {}))
        if any(t.device.type != "cpu" or not t.is_contiguous() for t in backing):
            raise ValueError("NixlConnector: the KV cache must be contiguous host memory")
        self.state_tensors = [states[g] for g in self.layout.state_group_ids]
        stride = sum(t[0].numel() * t.element_size() for ts in self.state_tensors for t in ts)
        if self.producer and stride:
            self._staging = torch.zeros(self.options.max_staged_states * stride, dtype=torch.uint8)
        self.agent = NixlAgent(self.engine_id)
        regions = [(t.data_ptr(), t.numel() * t.element_size()) for t in backing]
        regions += [
            (t.data_ptr(), t.numel() * t.element_size()) for ts in self.state_tensors for t in ts
        ]
        if self._staging is not None:
            regions.append((self._staging.data_ptr(), self._staging.numel()))
        self.agent.register(regions)
        self.local = self._descriptor(backing, stride)
        self.peers = Peers(
            self.agent, self.local, self.options.handshake_timeout_seconds, self.stats
        )
        if self.producer:
            o = self.options
            self._server = SideChannelServer(
                o.side_channel_host, o.side_channel_port, self.local.encode()
            )

    def _descriptor(self, backing: list[torch.Tensor], stride: int) -> LayoutDescriptor:
        return LayoutDescriptor(
            engine_id=self.engine_id,
            compat=self.compat,
            block_size=self.layout.block_size,
            layer_page_bytes=self.layout.layer_page_bytes,
            backing=tuple(t.data_ptr() for t in backing),
            groups=group_descs(self.layout),
            state_tensors=tuple(
                tuple(TensorDesc(t.data_ptr(), t[0].numel() * t.element_size()) for t in ts)
                for ts in self.state_tensors
            ),
            staging_base=self._staging.data_ptr() if self._staging is not None else 0,
            staging_stride=stride,
            agent_metadata=self.agent.metadata(),
        )

    # -- per step ------------------------------------------------------------------------------

    def start_load(self, metadata: ConnectorMetadata) -> None:
        now = time.monotonic()
        for item in metadata.saves:
            if isinstance(item, StartLease):
                self.leases.start(item.request_id, item.seconds)
            elif isinstance(item, NotifyOnly):
                self._notify.append(item)
        for spec in metadata.loads:
            assert isinstance(spec.keys, RemoteSource)
            self._loads.append(_Load(spec, spec.keys, now))
        self._progress()

    def save(self, metadata: ConnectorMetadata) -> None:
        for item in metadata.saves:
            if isinstance(item, StageState):
                self._stage(item)

    def _stage(self, item: StageState) -> None:
        """Copy the live state slots (final after this step's forward) to a staging entry."""
        assert self._staging is not None
        dst = self._staging.numpy()
        at = item.index * self.local.staging_stride
        for tensors, slot in zip(self.state_tensors, item.slots, strict=True):
            for t in tensors:
                src = t[slot].reshape(-1).view(torch.uint8).numpy()
                np.copyto(dst[at : at + src.size], src)
                at += src.size

    def get_finished(self, finished_request_ids: list[str]) -> KVConnectorOutput:
        self._progress()
        out = output_from_results(self._done)
        self._done = []
        if self.producer:
            self.leases.on_notifications(self.agent.notifications())
        out.finished_sending |= self.leases.take_finished()
        return out

    def has_pending(self) -> bool:
        return bool(self._loads or self._notify or self.leases.deadlines)

    def wait_for_progress(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._progress() or (
                self.producer and self.leases.on_notifications(self.agent.notifications())
            ):
                return
            time.sleep(0.001)

    # -- consumer ------------------------------------------------------------------------------

    def _progress(self) -> bool:
        """Advance every load (handshake, post, poll) and notification; True if any ended."""
        before = len(self._done)
        for load in list(self._loads):
            self._advance(load)
        self._send_notifications()
        return len(self._done) > before

    def _advance(self, load: _Load) -> None:
        try:
            if load.handle is None:
                peer = self.peers.get(load.source)
                if peer is not None:
                    self._post(load, peer)
            elif self._poll(load):
                return
            if time.monotonic() - load.started > self.options.load_timeout_seconds:
                self._fail(
                    load, "nixl_timeout", f"no data after {self.options.load_timeout_seconds}s"
                )
        except HandshakeFailed as exc:
            self._fail(load, exc.reason, str(exc))
        except Exception as exc:  # noqa: BLE001 - NIXL/UCX raise their own error types
            self.peers.forget(load.source)
            self._fail(load, "nixl_transfer_failed", f"{type(exc).__name__}: {exc}")

    def _post(self, load: _Load, peer: Peer) -> None:
        descs = self._plan(load.spec, load.source, peer.descriptor)
        load.nbytes = sum(n for _, _, n in descs)
        load.num_descs = len(descs)
        notif = f"{load.source.request_id}:{load.nbytes}".encode()
        if not descs:
            self.agent.notify(peer.agent_name, notif)
            self._succeed(load)
            return
        load.handle = self.agent.read(peer.agent_name, descs, notif)

    def _plan(self, spec: LoadSpec, src: RemoteSource, remote: LayoutDescriptor) -> list[Desc]:
        descs: list[Desc] = []
        attn = [i for i, g in enumerate(self.local.groups) if g.token_bytes]
        for j, group_index in enumerate(attn):
            group = self.local.groups[group_index]
            first = src.first_blocks[j] * remote.block_size
            lo, hi = consumer_range(group, spec.start, spec.end, self.local.block_size, first)
            table = dict(zip(spec.block_indices[j], spec.block_ids[j], strict=True))
            local_table = [table.get(k, 0) for k in range(max(table, default=-1) + 1)]
            read = GroupRead(
                group_index, lo, hi, local_table, list(src.block_ids[j]), src.first_blocks[j]
            )
            descs += attention_descs(self.local, remote, read)
        if src.staged_state is not None:
            for s, slot in enumerate(spec.state_slots):
                descs += state_descs(self.local, remote, s, slot, src.staged_state)
        return descs

    def _poll(self, load: _Load) -> bool:
        state = self.agent.state(load.handle)
        if state is XferState.PROC:
            return False
        handle, load.handle = load.handle, None
        self.agent.release(handle)
        if state is XferState.DONE:
            self._succeed(load)
        else:
            self.peers.forget(load.source)
            self._fail(load, "nixl_transfer_failed", "NIXL reported an error for the read")
        return True

    def _succeed(self, load: _Load) -> None:
        self._loads.remove(load)
        with self.stats.update() as s:
            bump(s.nbytes, Flow.LOAD, load.nbytes)
            bump(s.seconds, Flow.LOAD, time.monotonic() - load.started)
            s.descriptors += load.num_descs
            bump(s.transfers, Flow.LOAD)
        self._done.append(LoadResult(load.spec.request_id, True))

    def _fail(self, load: _Load, reason: str, message: str) -> None:
        if load.handle is not None and not self.agent.release(load.handle):
            log.error("NIXL: a failed read's handle could not be released; DMA may still run")
        load.handle = None
        if load in self._loads:
            self._loads.remove(load)
        log.warning(
            "NIXL load of request %s failed (%s): %s", load.spec.request_id, reason, message
        )
        with self.stats.update() as s:
            bump(s.failures, reason)
        self._done.append(LoadResult(load.spec.request_id, True, request_reason=reason))

    def _send_notifications(self) -> None:
        for item in list(self._notify):
            try:
                peer = self.peers.get(item.source)
            except HandshakeFailed:
                peer = None
                self._notify.remove(item)  # the producer's lease frees it
                continue
            if peer is not None:
                self.agent.notify(peer.agent_name, f"{item.source.request_id}:0".encode())
                self._notify.remove(item)

    def take_stats(self) -> NixlStats:
        return self.stats.take()

    def shutdown(self) -> None:
        if self._server is not None:
            self._server.close()
        if hasattr(self, "peers"):
            self.peers.close()
