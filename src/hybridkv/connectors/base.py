"""The KV connector contract, split by role.

A connector moves KV between this engine's cache and somewhere else (CPU memory, disk, a remote
store, a peer engine). The **scheduler half** decides what to load and save and writes plain
metadata; the **worker half** moves bytes. Only plain data crosses between them::

    scheduler half                                  worker half
    get_num_new_matched_tokens(req, local)  ->
    update_state_after_alloc(req, blocks, n)
    build_connector_meta(sched_out) -> meta  ---->  start_load(meta)   (before the forward)
                                                    [forward pass]
                                                    save(meta)         (after the forward)
    update_connector_output(out)            <----  get_finished(...) -> KVConnectorOutput
    request_finished(req, blocks)

Block ids live in one pool, so each id belongs to exactly one attention group; state slots are
named per state group. A load is finished only when the worker reports it in
``finished_recving``; failures are reported as ``failed_recving`` (whole request) or
``invalid_block_ids`` (some blocks), always together with ``finished_recving`` for async loads
(the request leaves the wait state either way). Bytes a load wrote are never trusted until then.

Optional hooks come in groups (``TierControl``, ``LeaseHooks``, ``PartialKV``): a connector
implements a group whole, and the engine asks ``capabilities()`` once at start which groups it
has. A wrapper subclasses ``connectors/delegating.py``, which forwards every hook.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from hybridkv.connectors.stats import ConnectorStats
from hybridkv.connectors.tier_events import NoTiersError, TierEvent, TierEventSink
from hybridkv.kv.coordinator import KVRequest
from hybridkv.request import RequestStatus
from hybridkv.sampling.transfer_params import TransferFields
from hybridkv.step_io import ConnectorMetadata, KVConnectorOutput

if TYPE_CHECKING:
    import numpy as np
    import torch

    from hybridkv.native import PageTable


class KVConnectorRequest(KVRequest, Protocol):
    """What a connector reads of a request: the KV core's view, its token ids, and the
    client's ``kv_transfer_params`` as parsed at the boundary (``transfer_fields``; None if
    none were sent; connectors that do not use them ignore them). The raw dict never reaches
    a connector."""

    @property
    def all_token_ids(self) -> list[int]: ...

    @property
    def transfer_fields(self) -> TransferFields | None: ...

    @property
    def status(self) -> RequestStatus: ...


@dataclass(frozen=True, slots=True)
class RequestBlocks:
    """A request's cache placement: ``block_ids[i]`` is its table in group
    ``layout.attention_group_ids[i]`` (null = 0) and ``state_slots[j]`` its live slot in
    ``layout.state_group_ids[j]``. In ``build_connector_meta``, ``restored_slots`` names the
    checkpoint slots restored into the live slots before this step's forward (None: no
    restore); they keep that state until the step ends."""

    block_ids: tuple[list[int], ...]
    state_slots: tuple[int, ...]
    restored_slots: tuple[int, ...] | None = None


@dataclass(frozen=True, slots=True)
class KeptKV:
    """What a finished request whose free is delayed keeps for a transfer: the blocks of tokens
    ``[0, num_tokens)``, in sliding-window groups only those a step resuming at ``window_at``
    reads, and no state slot (the connector copied the state it sends)."""

    num_tokens: int
    window_at: int


class KVCacheAccess(Protocol):
    """The worker half's window on the device cache (implemented over the runner's tensors).

    Block data is ``[n, group_size, layer_page_bytes]`` uint8: the block's page in every backing
    tensor. State data is one flat uint8 tensor per slot (every layer's state of the group).
    ``read_*`` return copies that later cache writes do not change."""

    def read_blocks(self, block_ids: list[int]) -> torch.Tensor: ...
    def write_blocks(self, block_ids: list[int], data: torch.Tensor | np.ndarray) -> None: ...
    def read_state(self, group_id: int, slot: int) -> torch.Tensor: ...
    def write_state(self, group_id: int, slot: int, data: torch.Tensor) -> None: ...
    def page_table(self) -> PageTable | None:
        """The backing pages as host addresses for ``hybridkv.native`` copy kernels, or None
        when they are not host memory (kernels then fall back to ``read_blocks`` etc.)."""
        ...


class BaseConnectorScheduler(ABC):
    """The scheduler half. Lives in the scheduler; never touches tensors."""

    @abstractmethod
    def get_num_new_matched_tokens(
        self, request: KVConnectorRequest, num_local_computed: int
    ) -> tuple[int, bool] | None:
        """Tokens beyond ``num_local_computed`` this connector can supply now, and whether the
        load is asynchronous. ``None`` means "not known yet, ask again in a later step".

        Side-effect free (may be called several times per request). The count must end at a
        restore boundary valid in every group (for state groups: a stored state at exactly that
        token) and at most at N-1 when the layout has state groups; ``load_async`` is False
        when the count is 0."""

    @abstractmethod
    def update_state_after_alloc(
        self, request: KVConnectorRequest, blocks: RequestBlocks, num_external_tokens: int
    ) -> None:
        """Called after every successful first allocation of a request that was looked up,
        also with 0 external tokens. Decide to load from ``num_external_tokens`` only; the
        tokens to load are ``[num_computed_tokens - num_external_tokens, num_computed_tokens)``
        as the request reports after allocation."""

    @abstractmethod
    def build_connector_meta(
        self, scheduled: list[tuple[KVConnectorRequest, int, int, RequestBlocks]]
    ) -> ConnectorMetadata:
        """Once per step, after all scheduling decisions: the plain-data metadata for the
        worker half (loads to start, saves to make). ``scheduled`` lists each scheduled
        request with the token span [start, end) it computes this step and its placement.
        Resets the per-step state."""

    def update_connector_output(self, output: KVConnectorOutput) -> None:
        """Digest the worker's report of a step (optional)."""
        return None

    def has_pending(self) -> bool:
        """True while this half holds something for its worker that only the next step's
        metadata carries: an idle engine then steps once more. Optional."""
        return False

    @abstractmethod
    def request_finished(
        self, request: KVConnectorRequest, blocks: RequestBlocks
    ) -> tuple[bool, dict[str, object] | None]:
        """Called exactly once per finished request, before its blocks are freed. Returns
        (delay_free_blocks, kv_transfer_params). With True the blocks stay allocated until the
        request id comes back in ``finished_sending``."""

    def get_step_interval(self, request: KVConnectorRequest) -> int:
        """Token interval at which this request's steps must end (0: no constraint), so the
        live state at each multiple can be saved (e.g. a restore unit's state checkpoint).
        Only applies within the prompt."""
        return 0

    def get_hit_sources(
        self, request: KVConnectorRequest, num_external_tokens: int
    ) -> dict[str, int]:
        """External prompt tokens by source (``cpu``, ``disk``, ``remote``, ``peer``) for the
        request's stats; by default all from ``external``."""
        return {"external": num_external_tokens} if num_external_tokens else {}

    def take_stats(self) -> ConnectorStats:
        """Counts since the previous call, as the connector's ``ConnectorStats`` subclass (the
        same type from both halves; see ``connectors/stats.py``)."""
        return ConnectorStats()

    def capabilities(self) -> Capabilities:
        """The optional hook groups this half implements, asked once when the engine starts:
        by default this object for each protocol it satisfies. A wrapper answers for what it
        wraps."""
        return Capabilities.of(self)


# -- optional hook groups: a connector implements a group whole, or not at all -------------


@runtime_checkable
class TierControl(Protocol):
    """A connector that keeps storage tiers (KV events, cache resets)."""

    def set_tier_event_sink(self, sink: TierEventSink) -> None:
        """Report every unit that becomes READY in a tier, or leaves one, to ``sink`` (called
        on any thread, under the tier's lock)."""
        ...

    def resident_units(self) -> list[TierEvent]:
        """A stored event for every READY unit of every tier now."""
        ...

    def reset_tiers(self) -> int:
        """Drop every unit neither pinned by a load nor being stored, from every tier (their
        bytes too, where the tier owns them); returns how many."""
        ...


@runtime_checkable
class LeaseHooks(Protocol):
    """A connector that hears about requests carrying ``kv_transfer_params`` before or
    without their KV (e.g. to keep a remote producer's lease alive, or release it)."""

    def on_waiting(self, requests: Sequence[KVConnectorRequest]) -> None:
        """Once per step, before ``build_connector_meta``: the requests still waiting for
        admission (new or preempted, in queue order) that carry ``kv_transfer_params``, the
        ones the scheduler did not look at yet included. Replaces the previous step's list;
        after a non-empty list, the next step calls it (with an empty list) even when none
        wait any more."""
        ...

    def request_dropped(self, request: KVConnectorRequest) -> None:
        """A request that ended (aborted, failed) while it held no KV: ``request_finished`` is
        not called for it. Only requests carrying ``kv_transfer_params`` are reported."""
        ...


@runtime_checkable
class PartialKV(Protocol):
    """A connector whose loads may fill blocks in part, or whose delayed frees keep only part
    of a request's KV (a P/D producer clips what the consumer reads)."""

    def get_first_whole_blocks(
        self, request: KVConnectorRequest, num_external_tokens: int
    ) -> tuple[int, ...] | None:
        """After ``update_state_after_alloc`` chose to load ``num_external_tokens``: per
        attention group, the first table entry from which the load writes every token of each
        entry it fills. Entries between the local hit and it get only part of their bytes (a
        window's first block the producer held only in part); the scheduler never hashes
        them. None: every entry the load fills is written whole."""
        ...

    def get_kept_kv(self, request: KVConnectorRequest) -> KeptKV | None:
        """For a request whose free ``request_finished`` delayed: what it keeps until
        ``finished_sending`` (everything else is freed at once); None keeps every block and
        state slot."""
        ...


@dataclass(frozen=True, slots=True)
class Capabilities:
    """The optional hook groups of a scheduler half, each the object to call (None: the
    connector has none), resolved once at start (``BaseConnectorScheduler.capabilities``)."""

    tiers: TierControl | None = None
    leases: LeaseHooks | None = None
    partial: PartialKV | None = None

    @classmethod
    def of(cls, half: object) -> Capabilities:
        """``half`` itself for each group whose protocol it satisfies."""
        return cls(
            half if isinstance(half, TierControl) else None,
            half if isinstance(half, LeaseHooks) else None,
            half if isinstance(half, PartialKV) else None,
        )

    def require_tiers(self, owner: str) -> TierControl:
        """The tiers, or ``NoTiersError`` naming ``owner``."""
        if self.tiers is None:
            raise NoTiersError(f"{owner} keeps no storage tiers to reset")
        return self.tiers


class BaseConnectorWorker(ABC):
    """The worker half. Lives beside the model runner; moves bytes, decides nothing."""

    def register_kv_caches(self, cache: KVCacheAccess) -> None:
        self.cache = cache

    @abstractmethod
    def start_load(self, metadata: ConnectorMetadata) -> None:
        """Before the forward pass: synchronous loads complete here (bytes written, verified);
        asynchronous ones are started and report through ``get_finished``."""

    @abstractmethod
    def save(self, metadata: ConnectorMetadata) -> None:
        """After the forward pass: store what the metadata asks for. Any bytes read from the
        cache must be read before this returns (the blocks may be reused next step)."""

    @abstractmethod
    def get_finished(self, finished_request_ids: list[str]) -> KVConnectorOutput:
        """Loads and delayed sends that completed since the last call, and failures."""

    def has_pending(self) -> bool:
        """True while asynchronous loads are in flight."""
        return False

    def needs_steps(self) -> bool:
        """True while this half has work only engine steps advance even when no request is
        left (a message still to send): the engine keeps stepping. Optional."""
        return False

    def wait_for_saves(self, timeout: float | None = None) -> bool:
        """Block until every save handed over so far is durable or failed; False on timeout."""
        return True

    def wait_for_progress(self, timeout: float) -> None:
        """Block up to ``timeout`` seconds until some in-flight transfer completes."""
        return None

    def take_stats(self) -> ConnectorStats:
        return ConnectorStats()

    def shutdown(self) -> None:
        """Stop background threads."""
        return None


@dataclass(frozen=True, slots=True)
class KVConnectorPair:
    scheduler: BaseConnectorScheduler
    worker: BaseConnectorWorker
