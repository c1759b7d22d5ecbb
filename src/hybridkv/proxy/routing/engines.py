"""``EngineState``: what the proxy knows of one decode engine -- its info, its index, the
work the proxy sent it, its measured prefill cost -- and the prediction counters."""

from __future__ import annotations

from dataclasses import dataclass, field

from hybridkv.kv.hashing import BlockHash, BlockHasher
from hybridkv.proxy.routing.engine_info import EngineInfo
from hybridkv.proxy.routing.index import EngineIndex
from hybridkv.proxy.routing.scoring import predict_hit_tokens
from hybridkv.proxy.routing.subscriber import EventSubscriber

DEFAULT_TOKEN_SECONDS = 1e-3  # a prefill token's cost until the engine's /metrics say
# an engine's measured cost is kept within this factor of the fleet's median: engines of one
# model differ less than one loaded machine's measurements do (``costs.py``)
MAX_COST_SPREAD = 1.25


@dataclass(slots=True)
class PredictionStats:
    num_observed: int = 0  # answers whose usage said how many prompt tokens were cached
    num_exact: int = 0  # predicted == actual
    num_over: int = 0  # predicted more than the engine hit (the costly mistake)
    predicted_tokens: int = 0
    actual_tokens: int = 0
    prompt_tokens: int = 0


@dataclass(slots=True)
class EngineState:
    url: str
    index: EngineIndex
    events_url: str | None = None  # --events, or found by the info route
    info: EngineInfo | None = None
    subscriber: EventSubscriber | None = None
    num_inflight: int = 0
    queued_tokens: int = 0  # uncached prompt tokens of requests sent and not finished
    token_seconds: float = DEFAULT_TOKEN_SECONDS  # measured prefill seconds per token
    metric_totals: dict[str, float] | None = None  # the last /metrics read (costs.py)
    predictions: PredictionStats = field(default_factory=PredictionStats)
    # the block hashes of prompts sent here and not answered yet, with their counts: what
    # the engine is computing now (routing only: never in the reported prediction)
    pending: dict[BlockHash, int] = field(default_factory=dict)
    # block hash -> the decision (its number) that first held it in ``pending``: the source
    # a later request sharing that block waits for (logged with each prediction)
    pending_owner: dict[BlockHash, int] = field(default_factory=dict)
    # the largest usage.kv_events_seq its answers carried, in the stream's life of that
    # many restarts (``settle.py``)
    answered_seq: int = -1
    answered_restarts: int = 0

    @property
    def indexed(self) -> bool:
        """Whether predictions mean anything: info known, events flowing, caching on."""
        sub = self.subscriber
        info_ok = self.info is not None and self.info.caching
        return info_ok and sub is not None and not sub.is_silent

    def predict(
        self, token_ids: tuple[int, ...], hashes: list[BlockHash], peers: list[EngineIndex]
    ) -> int:
        if not self.indexed or self.info is None:
            return 0
        info = self.info
        n = len(token_ids)
        return predict_hit_tokens(self.index, info.groups, hashes, n, info.block_size, peers)

    def pending_hit_tokens(self, hashes: list[BlockHash], num_tokens: int) -> int:
        """The prefix that requests in flight here are computing (their block chains)."""
        if self.info is None:
            return 0
        max_blocks = min((num_tokens - 1) // self.info.block_size, len(hashes))
        k = 0
        while k < max_blocks and hashes[k] in self.pending:
            k += 1
        return k * self.info.block_size

    @property
    def attention_only(self) -> bool:
        """No state group: once a prefill in flight here landed, every block it computed is
        held in every group (full attention, and sliding windows: blocks leave a window
        cached), so the hit on it is known beforehand -- a state group resumes only where a
        checkpoint is written."""
        groups = self.info.groups if self.info is not None else ()
        return bool(groups) and all(g.kind != "mamba" for g in groups)

    def landed_hit_tokens(
        self, token_ids: tuple[int, ...], hashes: list[BlockHash], peers: list[EngineIndex]
    ) -> int:
        """An attention-only engine's hit once the prefills in flight here have landed: the
        engine's rule on its index plus the blocks requests sent here are computing (its
        in-flight prefix rule holds the request until then, ``sched/inflight.py``)."""
        if not self.attention_only or not self.indexed or self.info is None:
            return self.predict(token_ids, hashes, peers)
        info = self.info
        n = len(token_ids)
        return predict_hit_tokens(
            self.index, info.groups, hashes, n, info.block_size, peers, landing=self.pending
        )

    def pending_source(self, hashes: list[BlockHash], hit_tokens: int) -> int | None:
        """The decision that holds the first block past ``hit_tokens`` (None: none does)."""
        k = hit_tokens // self.info.block_size if self.info is not None else 0
        return self.pending_owner.get(hashes[k]) if k < len(hashes) else None

    def hold_pending(self, hashes: list[BlockHash], owner: int = 0) -> None:
        for h in hashes:
            self.pending[h] = self.pending.get(h, 0) + 1
            self.pending_owner.setdefault(h, owner)

    def drop_pending(self, hashes: list[BlockHash]) -> None:
        for h in hashes:
            n = self.pending.pop(h, 0) - 1
            if n > 0:
                self.pending[h] = n
            else:
                self.pending_owner.pop(h, None)

    def expected_seconds(
        self, uncached: int, fleet_token_seconds: float | None = None, extra_tokens: float = 0.0
    ) -> float:
        """Queued work plus this prompt's uncached tokens (plus ``extra_tokens``), at this
        engine's measured cost kept within ``MAX_COST_SPREAD`` of the fleet's median."""
        cost = self.token_seconds
        if fleet_token_seconds is not None:
            low, high = fleet_token_seconds / MAX_COST_SPREAD, fleet_token_seconds * MAX_COST_SPREAD
            cost = min(max(cost, low), high)
        return (self.queued_tokens + uncached + extra_tokens) * cost


def block_hashes(info: EngineInfo, token_ids: tuple[int, ...], salt: str | None) -> list[BlockHash]:
    """The prompt's chained block hashes exactly as this engine computes them."""
    hashes: list[BlockHash] = []
    BlockHasher(info.block_size, info.hash_fn, salt).extend(hashes, token_ids)
    return hashes
