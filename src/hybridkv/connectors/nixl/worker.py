"""The NixlConnector's worker half: registers the cache once, serves the handshake (producer),
reads remote KV into this engine's blocks and live state slots (consumer, see ``reader``), and
reports.

Registered with the NIXL agent: the KV backing tensors, the state tensors, a producer's
staging entries (state checkpoints at E) and the lease words (``leases``: a producer's per
lease word, then the scratch words a consumer reads them into). A producer counts
notifications and expired leases into ``finished_sending`` and extends leases on heartbeats; a
consumer sends the heartbeats its scheduler half asks for (``heartbeats``).

A consumer-only agent has no UCX progress thread: a notification it posts (a heartbeat, or a
NotifyOnly before any READ to that producer) leaves only when something progresses its UCX
worker (the endpoint's wire-up first). Asking for notifications does, so ``get_finished``
asks every step; without that, heartbeats would never reach an idle-link producer.
"""

from __future__ import annotations

import logging
import time

import numpy as np
import torch

from hybridkv.connectors.base import BaseConnectorWorker, KVCacheAccess
from hybridkv.connectors.nixl.agent import NixlAgent, net_devices
from hybridkv.connectors.nixl.auth import AuthKey
from hybridkv.connectors.nixl.handshake import Peers
from hybridkv.connectors.nixl.heartbeats import HeartbeatSender
from hybridkv.connectors.nixl.layout import LayoutDescriptor, TensorDesc, group_descs
from hybridkv.connectors.nixl.leases import Leases
from hybridkv.connectors.nixl.meta import Heartbeat, NotifyOnly, StageState, StartLease
from hybridkv.connectors.nixl.options import NixlOptions
from hybridkv.connectors.nixl.reader import SCRATCH_WORDS, Reader
from hybridkv.connectors.nixl.side_channel import SideChannelServer
from hybridkv.connectors.nixl.stats import NixlStats
from hybridkv.connectors.outputs import output_from_results
from hybridkv.connectors.stats import StatsCounter
from hybridkv.kv.spec import KVCacheLayout
from hybridkv.step_io import ConnectorMetadata, KVConnectorOutput

log = logging.getLogger(__name__)

POLL_SECONDS = (0.0001, 0.001)  # an idle engine waiting for a read polls, backing off
LINGER_SECONDS = 1.0  # a consumer keeps progressing UCX this long after a NotifyOnly


class NixlWorker(BaseConnectorWorker):
    def __init__(
        self,
        options: NixlOptions,
        layout: KVCacheLayout,
        model_id: str,
        engine_id: str,
        producer: bool,
        compat: str,
        key: AuthKey,
    ) -> None:
        self.key = key
        self.options = options
        self.layout = layout
        self.model_id = model_id
        self.engine_id = engine_id
        self.producer = producer
        self.compat = compat
        self.stats = StatsCounter(NixlStats)
        # lease words (producer) then scratch words (consumer), registered
        self._words = torch.zeros(options.max_leases + SCRATCH_WORDS, dtype=torch.int64)
        lease_words = self._words[: options.max_leases].numpy().view(np.uint64)
        self.leases = Leases(self.stats, lease_words)
        self._server: SideChannelServer | None = None
        self._staging: torch.Tensor | None = None
        self._shut_down = False

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
        o = self.options
        devices = net_devices(o.ucx_net_devices, o.single_host())
        self.agent = NixlAgent(self.engine_id, self.producer, o.ucx_error_handling_mode, devices)
        tensors = backing + [t for ts in self.state_tensors for t in ts] + [self._words]
        if self._staging is not None:
            tensors.append(self._staging)
        self.agent.register([(t.data_ptr(), t.numel() * t.element_size()) for t in tensors])
        self.local = self._descriptor(backing, stride)
        o = self.options
        self.peers = Peers(
            self.agent,
            self.local,
            o.handshake_timeout_seconds,
            self.stats,
            self.key,
            o.heartbeat_interval_seconds,
        )
        scratch = self._words[self.options.max_leases :]
        self.reader = Reader(self.options, self.agent, self.peers, self.local, self.stats, scratch)
        self.heartbeats = HeartbeatSender(self.agent, self.peers, self.stats)
        if self.producer:
            o = self.options
            self._server = SideChannelServer(
                o.side_channel_host,
                o.side_channel_port,
                self.local.encode(),
                self.key,
                o.handshake_timeout_seconds,
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
            lease_base=self._words.data_ptr(),
            lease_words=self.options.max_leases,
            model_id=self.model_id,
            lease_seconds=self.options.abort_timeout_seconds if self.producer else 0.0,
            num_blocks=min((t.numel() * t.element_size() for t in backing), default=0)
            // self.layout.layer_page_bytes,
            staging_entries=self.options.max_staged_states if self._staging is not None else 0,
        )

    # -- per step ------------------------------------------------------------------------------

    def start_load(self, metadata: ConnectorMetadata) -> None:
        now = time.monotonic()
        for item in metadata.saves:
            if isinstance(item, StartLease):
                self.leases.start(item.request_id, item.seconds, item.lease)
            elif isinstance(item, NotifyOnly):
                self.reader.notify.append(item)
            elif isinstance(item, Heartbeat):
                self.heartbeats.add(item)
        for spec in metadata.loads:
            self.reader.add(spec, now)
        self.reader.progress()

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
        self.reader.progress()
        out = output_from_results(self.reader.done)
        self.reader.done = []
        self.reader.end_step()  # notifications of loads reported a step ago
        self.heartbeats.progress()
        if self.producer:
            self.leases.on_notifications(self.agent.notifications())
        else:  # no progress thread: this progresses UCX (~1 µs), so notifications leave
            self.agent.notifications()
        out.finished_sending |= self.leases.take_finished()
        return out

    def has_pending(self) -> bool:
        return self.reader.has_pending() or bool(self.leases.deadlines) or self._lingering()

    def needs_steps(self) -> bool:
        return bool(self.reader.notify) or self._lingering()

    def _lingering(self) -> bool:
        """A consumer-only agent sent a NotifyOnly lately, maybe the first message to that
        producer (no READ wired the endpoint up): until it has surely left, the engine keeps
        polling, which progresses UCX, even with nothing else to do."""
        return not self.producer and time.monotonic() - self.reader.last_notify < LINGER_SECONDS

    def wait_for_progress(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        delay = POLL_SECONDS[0]
        while time.monotonic() < deadline:
            heard = self.agent.notifications()  # also progresses UCX (no thread on a consumer)
            if (self.producer and self.leases.on_notifications(heard)) or self.reader.progress():
                return
            time.sleep(delay)
            delay = min(2 * delay, POLL_SECONDS[1])

    def take_stats(self) -> NixlStats:
        return self.stats.take()

    def shutdown(self) -> None:
        """Stop serving handshakes, drop the peers, then deregister every region from NIXL
        before the engine frees the memory (no peer can read or write it afterwards).
        Idempotent."""
        if self._shut_down:
            return
        self._shut_down = True
        if self._server is not None:
            self._server.close()
        if hasattr(self, "peers"):
            self.peers.close()
        if hasattr(self, "reader"):
            self.reader.close()
        if hasattr(self, "agent"):
            self.agent.close()
