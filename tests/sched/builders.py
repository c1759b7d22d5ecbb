"""Builders for scheduler tests: a scheduler over a named layout, driven by the PageRunner."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from hybridkv.config import SchedulerConfig
from hybridkv.connectors.config import LoadFailurePolicy
from hybridkv.engine.step import run_step
from hybridkv.kv.coordinator import KVCacheConfig, KVCacheCoordinator
from hybridkv.kv.hashing import BlockHasher, get_hash_fn
from hybridkv.request import Request
from hybridkv.sampling.params import SamplingParams
from hybridkv.sched.kv_transfer import KVTransfer
from hybridkv.sched.scheduler import Scheduler
from tests.kv.builders import make_layout
from tests.sched.page_runner import PageRunner
from tests.sched.scripted_connector import Script, ScriptedScheduler, ScriptedWorker


@dataclass
class Harness:
    scheduler: Scheduler
    kv: KVCacheCoordinator
    runner: PageRunner
    outputs: dict[str, list[int]] = field(default_factory=dict)
    finish: dict[str, str] = field(default_factory=dict)
    connector: ScriptedScheduler | None = None
    worker: ScriptedWorker | None = None

    def add(
        self,
        req_id: str,
        prompt: list[int],
        max_tokens: int = 8,
        kv_transfer_params: dict[str, object] | None = None,
        cache_boundaries: tuple[int, ...] = (),
    ) -> Request:
        hasher = BlockHasher(self.kv.block_size, get_hash_fn("sha256"))
        extra: dict[str, object] | None = None
        if kv_transfer_params or cache_boundaries:
            extra = {"kv_transfer_params": kv_transfer_params} if kv_transfer_params else {}
            if cache_boundaries:
                extra["cache_boundaries"] = list(cache_boundaries)
        params = SamplingParams(max_tokens=max_tokens, temperature=0.0, extra_args=extra)
        req = Request(req_id, prompt, params, hasher)
        self.scheduler.add_request(req)
        return req

    def step(self) -> None:
        _, _, updated = run_step(self.scheduler, self.runner, self.worker)
        for req in updated:
            self.outputs[req.request_id] = req.output_token_ids
            if req.status.is_finished:
                self.finish[req.request_id] = req.status.value
        self.kv.check_integrity()

    def run(self, max_steps: int = 10_000) -> None:
        for _ in range(max_steps):
            if not self.scheduler.has_unfinished_requests():
                return
            self.step()
        raise AssertionError("requests did not finish")

    def assert_no_leaks(self) -> None:
        self.kv.check_integrity()
        assert self.kv.is_idle(), "blocks or state slots still held after every request finished"


def make_harness(
    layout: str,
    num_blocks: int = 64,
    num_state_slots: int = 16,
    block_size: int = 4,
    window: int = 8,
    interval: int = 0,
    max_num_seqs: int = 8,
    budget: int = 64,
    max_model_len: int = 4096,
    caching: bool = True,
    scripts: dict[str, Script] | None = None,
    policy: str = "recompute",
) -> Harness:
    """A scheduler over a named layout; with ``scripts``, a scripted connector too."""
    lay = make_layout(layout, block_size, window)
    kv = KVCacheCoordinator(lay, KVCacheConfig(num_blocks, num_state_slots, caching, interval))
    config = SchedulerConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=budget)
    runner = PageRunner(lay)
    if scripts is None:
        return Harness(Scheduler(config, max_model_len, kv), kv, runner)
    connector = ScriptedScheduler(scripts)
    transfer = KVTransfer(connector, LoadFailurePolicy(policy), kv)
    scheduler = Scheduler(config, max_model_len, kv, transfer)
    return Harness(
        scheduler, kv, runner, connector=connector, worker=ScriptedWorker(runner, scripts)
    )


def random_prompt(seed: int, length: int, prefix: list[int] | None = None) -> list[int]:
    rng = random.Random(seed)
    head = list(prefix or [])
    return head + [rng.randrange(997) for _ in range(length - len(head))]
