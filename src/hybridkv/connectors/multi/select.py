"""Which child of a ``MultiConnector`` loads a request's external tokens.

- ``first``: the first child (in config order) reporting a hit;
- ``weighted``: the child maximising ``matched_tokens * load_weight``;
- ``cost`` (default): the child whose expected time to the first token is lowest::

      cost(child) = latency + load_bytes(hit) / bandwidth + (N - local - hit) * prefill_s_per_token
      cost(none)  = (N - local) * prefill_s_per_token

  so a slow child with a longer hit loses to a fast one with a slightly shorter hit, and a hit
  slower to load than to recompute is not taken. Latency and bandwidth are running estimates
  per child (``LoadEstimate``, fitted from the loads it served); the prefill cost per token is
  the engine's, measured from its steps (``PrefillEstimate``). Both start from priors.

A child still looking ("ask again") delays the request only if waiting for it could beat the
best answer so far (``worth_waiting``): never when that answer is already a full hit; under
``cost`` only if the pending child, at its best (a full hit, one more round trip away), would
cost less than the best answer so far.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from enum import Enum

from hybridkv.kv.spec import KVCacheLayout, SlidingWindowSpec, SpecKind

DECAY = 0.8  # weight of the past in the running estimates (per sample)
PRIOR_LATENCY_S = 1e-3
PRIOR_BANDWIDTH = 1e9  # bytes/s
PRIOR_PREFILL_S_PER_TOKEN = 1e-3
MIN_PREFILL_TOKENS = 8  # decode steps (a token per request) say little about prefill


class Selection(str, Enum):
    FIRST = "first"
    WEIGHTED = "weighted"
    COST = "cost"


class LoadEstimate:
    """Latency + bytes/bandwidth of one child's loads: an exponentially weighted least-squares
    line through (bytes, seconds) samples; the priors until two distinct sizes were seen."""

    def __init__(
        self, latency: float = PRIOR_LATENCY_S, bandwidth: float = PRIOR_BANDWIDTH
    ) -> None:
        self.latency = latency
        self.bandwidth = bandwidth
        self._w = self._x = self._y = self._xx = self._xy = 0.0
        self.num_samples = 0

    def seconds(self, nbytes: int) -> float:
        return self.latency + nbytes / self.bandwidth

    def add(self, nbytes: int, seconds: float) -> None:
        x, y = float(nbytes), max(0.0, seconds)
        self._w = DECAY * self._w + 1.0
        self._x = DECAY * self._x + x
        self._y = DECAY * self._y + y
        self._xx = DECAY * self._xx + x * x
        self._xy = DECAY * self._xy + x * y
        self.num_samples += 1
        mean_x, mean_y = self._x / self._w, self._y / self._w
        var = self._xx / self._w - mean_x * mean_x
        slope = (self._xy / self._w - mean_x * mean_y) / var if var > 1e-9 * mean_x**2 else 0.0
        if slope <= 0:  # one size seen (or noise): keep the bandwidth, explain the rest by latency
            self.latency = max(0.0, mean_y - mean_x / self.bandwidth)
            return
        self.bandwidth = 1.0 / slope
        self.latency = max(0.0, mean_y - slope * mean_x)


class PrefillEstimate:
    """Seconds per computed token: the lowest of the last ``WINDOW`` steps of at least
    ``MIN_PREFILL_TOKENS`` tokens. Everything else a step's wall time can hold (warm-up, an
    idle pause before the next step, a busy machine) only adds to it, so the lowest recent
    sample is the compute cost itself."""

    WINDOW = 32

    def __init__(self, s_per_token: float = PRIOR_PREFILL_S_PER_TOKEN) -> None:
        self.s_per_token = s_per_token
        self._samples: deque[float] = deque(maxlen=self.WINDOW)

    @property
    def num_samples(self) -> int:
        return len(self._samples)

    def add(self, tokens: int, seconds: float) -> None:
        if tokens < MIN_PREFILL_TOKENS or seconds <= 0:
            return
        self._samples.append(seconds / tokens)
        self.s_per_token = min(self._samples)


def load_bytes(layout: KVCacheLayout, num_tokens: int) -> int:
    """Bytes a load of ``num_tokens`` moves: every full-attention block, the window's blocks,
    the states at the end."""
    total = sum(layout.state_slot_bytes(g) for g in layout.state_group_ids)
    for group in layout.groups:
        if group.kind is SpecKind.STATE:
            continue
        tokens = num_tokens
        if isinstance(group.spec, SlidingWindowSpec):
            tokens = min(num_tokens, group.spec.sliding_window + layout.block_size)
        total += -(-tokens // layout.block_size) * layout.page_bytes
    return total


@dataclass(frozen=True, slots=True)
class Hit:
    """One child's answer for a request: tokens beyond the local hit, and whether async."""

    child: int
    tokens: int
    is_async: bool


def choose(
    selection: Selection,
    hits: list[Hit],
    weights: list[float],
    estimates: list[LoadEstimate],
    prefill: PrefillEstimate,
    layout: KVCacheLayout,
    num_to_compute: int,
) -> Hit | None:
    """The hit to load (None: compute everything). ``num_to_compute``: tokens after the
    local hit."""
    hits = [h for h in hits if h.tokens > 0]
    if not hits:
        return None
    if selection is Selection.FIRST:
        return hits[0]
    if selection is Selection.WEIGHTED:
        return max(hits, key=lambda h: (h.tokens * weights[h.child], -h.child))
    best: Hit | None = None
    best_cost = _cost(None, estimates, prefill, layout, num_to_compute)
    for hit in hits:
        cost = _cost(hit, estimates, prefill, layout, num_to_compute)
        if cost < best_cost:
            best, best_cost = hit, cost
    return best


def worth_waiting(
    selection: Selection,
    best: Hit | None,
    pending: list[int],
    weights: list[float],
    estimates: list[LoadEstimate],
    prefill: PrefillEstimate,
    layout: KVCacheLayout,
    num_to_compute: int,
    max_hit: int,
) -> bool:
    """Whether to ask again for children still looking up (``pending``) rather than take
    ``best`` (``choose``'s answer among the others; None: compute everything) now.
    ``max_hit``: the most tokens any child can load (N - 1 - local). A pending child is
    assumed to answer that much at best, one more of its round trips (its latency) away."""
    have = best.tokens if best is not None else 0
    if not pending or have >= max_hit:
        return False  # a full hit: nothing can load more
    if selection is Selection.FIRST:
        return best is None or min(pending) < best.child
    if selection is Selection.WEIGHTED:
        score = have * weights[best.child] if best is not None else 0.0
        return any(max_hit * weights[i] > score for i in pending)
    best_cost = _cost(best, estimates, prefill, layout, num_to_compute)
    for i in pending:
        waiting = estimates[i].latency + _cost(
            Hit(i, max_hit, True), estimates, prefill, layout, num_to_compute
        )
        if waiting < best_cost:
            return True
    return False


def _cost(
    hit: Hit | None,
    estimates: list[LoadEstimate],
    prefill: PrefillEstimate,
    layout: KVCacheLayout,
    num_to_compute: int,
) -> float:
    """Expected seconds to the first token loading ``hit`` (None: recomputing everything)."""
    if hit is None:
        return num_to_compute * prefill.s_per_token
    load = estimates[hit.child].seconds(load_bytes(layout, hit.tokens))
    return load + (num_to_compute - hit.tokens) * prefill.s_per_token
