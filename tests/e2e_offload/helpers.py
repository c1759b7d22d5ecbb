"""Engines, prompts and checks shared by the offloading end-to-end tests.

Every workload is compared token for token with a run that caches nothing
(``enable_prefix_caching=False``, no connector)."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

from hybridkv import LLM, SamplingParams
from hybridkv.connectors.offloading.scheduler import OffloadingScheduler
from hybridkv.connectors.offloading.units import UnitGeometry
from hybridkv.connectors.offloading.worker import OffloadingWorker
from tests.support.configs import offload_config
from tests.support.lifetimes import keep, track
from tests.support.prompts import random_ids
from tests.support.stats import flat_counters

C = 32  # chunk_tokens
MAX_TOKENS = 6
KV_MEMORY = "16MiB"
PARAMS = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)


ids = random_ids


PREFIX = ids(128, 1)
PROMPTS = [PREFIX + ids(20 + i, 10 + i) for i in range(5)]  # 4 units of shared prefix each
OTHER = ids(170, 99)  # an unrelated prompt of 5 units


def offload(
    cpu: int | str | None = None, disk: Path | None = None, remote: str | None = None, **extra: Any
) -> dict[str, Any]:
    return offload_config(cpu, disk, remote, **{"chunk_tokens": C, **extra})


def make_llm(model: Path, kv_transfer_config: dict[str, Any] | None, **kw: Any) -> LLM:
    opts: dict[str, Any] = {
        "dtype": "float32",
        "kv_cache_memory": KV_MEMORY,
        "block_size": 16,
        "max_model_len": 512,
    }
    opts.update(kw)
    return track(LLM(model=str(model), kv_transfer_config=kv_transfer_config, **opts))


_REFERENCE: dict[tuple[Path, tuple[int, ...]], list[int]] = {}


@functools.lru_cache(maxsize=4)
def _reference_llm(model: Path) -> LLM:
    return keep(make_llm(model, None, enable_prefix_caching=False))  # closed with the session


def reference(model: Path, prompts: list[list[int]]) -> list[list[int]]:
    """Greedy outputs of a run that caches nothing (one batch for the prompts not seen yet)."""
    todo = [p for p in prompts if (model, tuple(p)) not in _REFERENCE]
    if todo:
        outs = _reference_llm(model).generate(todo, PARAMS, use_tqdm=False)
        for prompt, out in zip(todo, outs, strict=True):
            _REFERENCE[(model, tuple(prompt))] = out.token_ids
    return [_REFERENCE[(model, tuple(p))] for p in prompts]


def unit_bytes(model: Path) -> int:
    """Bytes of the largest restore unit of ``model``'s layout."""
    return UnitGeometry(_reference_llm(model).engine.layout, C).unit_nbytes(8 * C)


def generate(llm: LLM, prompts: list[list[int]]) -> list[Any]:
    outs = llm.generate(prompts, PARAMS, use_tqdm=False)
    assert worker(llm).wait_for_saves(10.0)
    return outs


def sched(llm: LLM) -> OffloadingScheduler:
    inner: Any = llm.engine.connector.scheduler  # type: ignore[union-attr]
    while not isinstance(inner, OffloadingScheduler):
        inner = inner.inner
    return inner


def worker(llm: LLM) -> OffloadingWorker:
    inner: Any = llm.engine.connector.worker  # type: ignore[union-attr]
    while not isinstance(inner, OffloadingWorker):
        inner = inner.inner
    return inner


def reset_device_cache(llm: LLM) -> None:
    assert llm.engine.kv.reset_prefix_cache()


def counters(llm: LLM) -> dict[str, float]:
    return flat_counters(llm.engine.stats().transfer.connector)


def assert_clean(llm: LLM) -> None:
    """Nothing leaked in the device pool or either tier."""
    engine = llm.engine
    assert not engine.has_unfinished_requests()
    engine.kv.check_integrity()
    assert engine.kv.is_idle()
    w, s = worker(llm), sched(llm)
    assert w.wait_for_saves(10.0) and not w.has_pending() and w.inflight_bytes() == 0
    for tier in s.stack:
        tier.index.check_accounting()
        assert tier.index.num_pinned() == 0 and tier.index.num_pending() == 0
