"""An engine's measured prefill cost, seconds per computed prompt token, from its ``/metrics``:
its prefill throughput between two reads, smoothed::

    (delta hybridkv:prompt_compute_seconds_total) / (delta hybridkv:prompt_tokens_computed_total)

the engine steps' time spent on prompt tokens over the prompt tokens they computed (a counter
pair: it does not grow with the engine's queue, which the cost model counts apart). An engine
without that pair (vLLM) is read from its per-request prefill times instead::

    (delta vllm:request_prefill_time_seconds_sum)
        / (delta vllm:prompt_tokens_total - delta hybridkv:cached_prompt_tokens_total)

which includes the time a scheduled request waits for others' chunks. Below ``MIN_TOKENS``
new computed tokens the last value stays. The answer is bounded (``MAX_METRICS_BYTES``) and
every number checked: a bad one is skipped.
"""

from __future__ import annotations

import math

import httpx

from hybridkv.proxy.routing.engines import EngineState

MAX_METRICS_BYTES = 8 << 20
MIN_TOKENS = 64
SMOOTHING = 0.5  # weight of the new measurement
_NAMES = {  # vLLM's names where they exist (an engine exports one name of each pair)
    "hybridkv:prompt_compute_seconds_total": "step_seconds",
    "hybridkv:prompt_tokens_computed_total": "step_tokens",
    "vllm:request_prefill_time_seconds_sum": "seconds",
    "hybridkv:request_prefill_time_seconds_sum": "seconds",
    "vllm:prompt_tokens_total": "prompt",
    "hybridkv:prompt_tokens_total": "prompt",
    "hybridkv:cached_prompt_tokens_total": "cached",
}


async def refresh_cost(
    engine: EngineState, client: httpx.AsyncClient, headers: dict[str, str]
) -> None:
    try:
        answer = await client.get(engine.url + "/metrics", headers=headers, timeout=2.0)
    except httpx.HTTPError:
        return
    if answer.status_code != 200 or len(answer.content) > MAX_METRICS_BYTES:
        return
    now = read_totals(answer.text)
    before, engine.metric_totals = engine.metric_totals, now
    if before is None:
        return
    measured = measured_token_seconds(before, now)
    if measured is not None:
        engine.token_seconds += SMOOTHING * (measured - engine.token_seconds)


def measured_token_seconds(before: dict[str, float], now: dict[str, float]) -> float | None:
    """Seconds per computed prompt token between two reads, or None below ``MIN_TOKENS``
    (or when a counter went back: the engine restarted)."""
    tokens = now["step_tokens"] - before["step_tokens"]
    seconds = now["step_seconds"] - before["step_seconds"]
    if now["step_tokens"] == 0:  # no step counters: the per-request prefill times
        tokens = (now["prompt"] - now["cached"]) - (before["prompt"] - before["cached"])
        seconds = now["seconds"] - before["seconds"]
    if tokens >= MIN_TOKENS and seconds > 0:
        return seconds / tokens
    return None


def read_totals(text: str) -> dict[str, float]:
    """The sums of a Prometheus text page (labels summed over)."""
    totals = dict.fromkeys(_NAMES.values(), 0.0)
    for line in text.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        field = _NAMES.get(name)
        if field is None:
            continue
        try:
            value = float(line.rsplit(" ", 1)[1])
        except (IndexError, ValueError):
            continue
        if math.isfinite(value) and value >= 0:
            totals[field] += value
    return totals
