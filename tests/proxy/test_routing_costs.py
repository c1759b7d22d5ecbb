"""The cost policy's prefill cost: the engine's prompt tokens computed over the step time spent
on them (a counter pair on its /metrics), read by the proxy between two scrapes. Unlike the
per-request prefill time, it does not grow with the engine's own queue."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from hybridkv.engine.stats import EngineStats, StepCounters, StepStats
from hybridkv.metrics.prometheus import ServerMetrics
from hybridkv.proxy.routing.costs import MIN_TOKENS, measured_token_seconds, read_totals
from hybridkv.sampling.params import SamplingParams
from hybridkv.step_io import ScheduledRequest, SchedulerOutput


@dataclass
class _Live:
    num_prompt_tokens: int
    scheduled_time: float | None = None


def _step(chunks: dict[str, tuple[int, int]]) -> SchedulerOutput:
    """One step computing ``(start, length)`` tokens of each request."""
    requests = [
        ScheduledRequest(rid, [7] * n, start, ([],), (), start == 0, True, SamplingParams())
        for rid, (start, n) in chunks.items()
    ]
    return SchedulerOutput(requests=requests)


def _run(schedule: list[dict[str, tuple[int, int]]], live: dict[str, _Live]) -> StepStats:
    """Each step takes one second."""
    counters = StepCounters()
    for t, chunks in enumerate(schedule):
        counters.record(_step(chunks), 0, live, float(t), float(t + 1))
    return counters.snapshot()


def test_the_prefill_cost_is_a_throughput_not_a_queue_wait() -> None:
    # four 512-token prompts, a 512-token step budget, one second a step: served one after
    # the other, or in four interleaved chunks of 128 (each request's own prefill time is
    # then 4 s instead of 1 s: that measure grows with the queue)
    prompts = {f"r{i}": 512 for i in range(4)}
    serial = [{rid: (0, 512)} for rid in prompts]
    interleaved = [{rid: (128 * k, 128) for rid in prompts} for k in range(4)]
    for schedule in (serial, interleaved):
        stats = _run(schedule, {rid: _Live(n) for rid, n in prompts.items()})
        assert stats.prompt_tokens == 2048
        assert stats.prompt_seconds == pytest.approx(4.0)  # 1.95 ms a token either way


def test_a_steps_time_is_shared_between_its_prompt_and_decode_tokens() -> None:
    live = {"p": _Live(508), "d": _Live(10)}
    stats = _run([{"p": (0, 508), "d": (12, 4)}], live)  # d decodes past its prompt
    assert stats.prompt_tokens == 508
    assert stats.prompt_seconds == pytest.approx(508 / 512)
    assert _run([{"d": (12, 4)}], live).prompt_seconds == 0.0  # decode only: no prefill time


def _page(prompt_tokens: int, prompt_seconds: float) -> str:
    metrics = ServerMetrics("m")
    steps = StepStats(num_steps=1, prompt_tokens=prompt_tokens, prompt_seconds=prompt_seconds)
    metrics.publish(EngineStats(steps=steps))
    return metrics.render().decode()


def test_the_proxy_reads_the_counter_pair_from_the_engines_page() -> None:
    before, now = read_totals(_page(1000, 2.0)), read_totals(_page(3000, 6.0))
    assert measured_token_seconds(before, now) == pytest.approx(2e-3)
    # too few new tokens to measure, or an engine restarted (counters back to zero): no value
    assert measured_token_seconds(now, read_totals(_page(3000 + MIN_TOKENS - 1, 7.0))) is None
    assert measured_token_seconds(now, read_totals(_page(500, 1.0))) is None


def test_an_engine_without_the_pair_is_read_from_its_request_prefill_times() -> None:
    def page(prompt: int, cached: int, seconds: float) -> dict[str, float]:
        return read_totals("\n".join([
            f'vllm:prompt_tokens_total{{model_name="m"}} {prompt}',
            f'hybridkv:cached_prompt_tokens_total{{model_name="m",source="local"}} {cached}',
            f'vllm:request_prefill_time_seconds_sum{{model_name="m"}} {seconds}',
            'hybridkv:prompt_compute_seconds_total{model_name="m"} inf',  # skipped
            'hybridkv:prompt_tokens_computed_total{model_name="m"} -1',  # skipped
        ]))  # fmt: skip

    assert measured_token_seconds(page(0, 0, 0.0), page(1000, 200, 4.0)) == pytest.approx(5e-3)
