"""``EngineStats``: one typed snapshot of the engine's state and counters.

``EngineCore.stats()`` takes it on the engine thread; ``/metrics`` (``metrics/prometheus.py``), the
server's periodic log line (``stats_line``) and the tests read it, and nothing else reaches
into the engine for numbers. Counts are totals since start.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from hybridkv.connectors.stats import ConnectorStats
from hybridkv.kv.checkpoint_counters import CheckpointStats
from hybridkv.kv.spec import KVCacheLayout
from hybridkv.kv_events.stats import PublisherStats
from hybridkv.sched.inflight import InflightStats
from hybridkv.step_io import FailureReason, SchedulerOutput

if TYPE_CHECKING:
    from hybridkv.sched.kv_transfer import TransferStats as SchedulerTransferStats


@dataclass(frozen=True, slots=True)
class GroupCacheStats:
    group_id: int
    kind: str  # full_attention | sliding_window | state
    queried_tokens: int
    hit_tokens: int  # this group's own longest hits, summed


@dataclass(frozen=True, slots=True)
class TransferStats:
    """KV transfer totals; all zero without a connector."""

    load_failures: Mapping[FailureReason, int] = field(default_factory=dict)  # scheduler's view
    recomputed_tokens: int = 0  # tokens recomputed after failed or invalid loads
    failed_requests: int = 0  # requests that recovered from (or failed on) a bad load
    external_tokens: int = 0  # prompt tokens admitted as external hits
    connector: ConnectorStats | None = None  # the connector's own totals (tiers, children)


@dataclass(frozen=True, slots=True)
class StepStats:
    """Engine steps: how many ran, the newest one's tokens, and tokens computed in all."""

    num_steps: int = 0
    last_step_tokens: int = 0  # prompt + output tokens the newest step computed
    prompt_tokens: int = 0  # prompt tokens computed (prefix hits and loads excluded)
    generation_tokens: int = 0  # tokens sampled
    # the steps' wall time spent on prompt tokens: each step's seconds x its prompt tokens /
    # all its tokens. prompt_seconds / prompt_tokens is the engine's measured prefill cost
    # (a throughput: it does not grow with the queue, unlike the per-request prefill time)
    prompt_seconds: float = 0.0


@dataclass(frozen=True, slots=True)
class EngineStats:
    num_running: int = 0
    num_waiting: int = 0
    num_waiting_for_remote_kv: int = 0  # included in num_waiting
    kv_usage: float = 0.0  # fraction of KV blocks in use, 0..1
    num_preemptions: int = 0
    prefix_cache_queries: int = 0  # lookups (one per admitted request)
    prefix_cache_queried_tokens: int = 0
    prefix_cache_hit_tokens: int = 0  # usable hits: valid in every group
    groups: tuple[GroupCacheStats, ...] = ()
    transfer: TransferStats = field(default_factory=TransferStats)
    kv_events: PublisherStats | None = None  # KV event batches published / dropped (if on)
    steps: StepStats = field(default_factory=StepStats)
    checkpoints: CheckpointStats = field(default_factory=CheckpointStats)  # state checkpoints
    inflight: InflightStats = field(default_factory=InflightStats)  # the in-flight prefix rule


def group_cache_stats(
    layout: KVCacheLayout, queried_tokens: int, hit_tokens: Sequence[int]
) -> tuple[GroupCacheStats, ...]:
    """Each layout group's lookups and own hits (every group is queried for every token)."""
    return tuple(
        GroupCacheStats(g.group_id, g.kind.value, queried_tokens, hits)
        for g, hits in zip(layout.groups, hit_tokens, strict=False)
    )


def stats_line(s: EngineStats, prev: EngineStats | None = None, seconds: float = 0.0) -> str:
    """The periodic log line (vLLM's): throughput and prefix hit rates over the interval since
    ``prev`` (``seconds`` long), queues, KV usage, per-group hits, external hits."""
    prev = prev or EngineStats()
    dt = max(seconds, 1e-9)
    prompt_tps = (s.steps.prompt_tokens - prev.steps.prompt_tokens) / dt
    gen_tps = (s.steps.generation_tokens - prev.steps.generation_tokens) / dt
    queried = s.prefix_cache_queried_tokens - prev.prefix_cache_queried_tokens
    hit = _rate(s.prefix_cache_hit_tokens - prev.prefix_cache_hit_tokens, queried)
    line = (
        f"Avg prompt throughput: {prompt_tps:.1f} tokens/s, Avg generation throughput: "
        f"{gen_tps:.1f} tokens/s, Running: {s.num_running} reqs, Waiting: {s.num_waiting} reqs "
        f"(loading KV: {s.num_waiting_for_remote_kv}), KV cache usage: {s.kv_usage:.1%}, "
        f"Prefix cache hit rate: {hit:.1%}"
    )
    old = {g.group_id: g for g in prev.groups}
    per_group = []
    for g in s.groups:
        before = old.get(g.group_id, GroupCacheStats(g.group_id, g.kind, 0, 0))
        rate = _rate(g.hit_tokens - before.hit_tokens, g.queried_tokens - before.queried_tokens)
        per_group.append(f"{g.group_id}:{g.kind} {rate:.1%}")
    if per_group:
        line += f" (per group: {', '.join(per_group)})"
    line += f", Preemptions: {s.num_preemptions}"
    t, pt = s.transfer, prev.transfer
    if t.connector is not None:
        external = t.external_tokens - pt.external_tokens
        failures = sum(t.load_failures.values())
        line += f", External hits: {external} tokens ({_rate(external, queried):.1%})"
        line += f", KV load failures: {failures}"
    return line


def _rate(part: int, whole: int) -> float:
    return part / whole if whole > 0 else 0.0


class _Live(Protocol):
    num_prompt_tokens: int
    scheduled_time: float | None


class StepCounters:
    """Counts each step's tokens (on the engine thread) and stamps when a request was first
    scheduled (the end of its queue time)."""

    def __init__(self) -> None:
        self._stats = StepStats()

    def record(
        self,
        out: SchedulerOutput,
        num_sampled: int,
        live: Mapping[str, _Live],
        started: float,
        finished: float,
    ) -> None:
        num_prompt = 0
        for r in out.requests:
            req = live.get(r.request_id)
            if req is None:
                continue
            if req.scheduled_time is None:
                req.scheduled_time = started
            end = min(r.start_pos + len(r.token_ids), req.num_prompt_tokens)
            num_prompt += max(0, end - r.start_pos)
        s = self._stats
        share = num_prompt / out.num_scheduled_tokens if out.num_scheduled_tokens > 0 else 0.0
        self._stats = StepStats(
            s.num_steps + 1 if out.requests else s.num_steps,
            out.num_scheduled_tokens if out.requests else s.last_step_tokens,
            s.prompt_tokens + num_prompt,
            s.generation_tokens + num_sampled,
            s.prompt_seconds + max(0.0, finished - started) * min(1.0, share),
        )

    def snapshot(self) -> StepStats:
        return self._stats


class _CountingHalf(Protocol):
    def take_stats(self) -> ConnectorStats: ...


class TransferCounters:
    """Sums what a connector's halves counted, taken after each step (on the engine thread),
    into totals since start."""

    def __init__(self) -> None:
        self._connector: ConnectorStats | None = None

    def record(self, *halves: _CountingHalf) -> None:
        for half in halves:
            taken = half.take_stats()
            if self._connector is None:
                self._connector = taken
            else:
                self._connector.merge(taken)

    def snapshot(self, scheduler_view: SchedulerTransferStats | None) -> TransferStats:
        """The totals beside the scheduler's view of transfers (None: no transfers, all zero)."""
        if scheduler_view is None:
            return TransferStats()
        t = scheduler_view
        totals = self._connector.copy() if self._connector is not None else None
        return TransferStats(dict(t.load_failures), t.recomputed_tokens, t.failed_requests,
                             t.external_tokens, totals)  # fmt: skip
