"""Compute threads per step (``model/step/threads.py``): the process's pool for every step, set
again when changed behind the engine's back, or a fixed count from the environment."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from hybridkv.model.step import threads
from hybridkv.model.step.threads import ENV, StepThreads


@pytest.fixture(autouse=True)
def keep_pool(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(threads, "_last", threads._LastSet())  # no earlier engine's setting
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_auto_uses_the_pool_for_every_step(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV, raising=False)
    torch.set_num_threads(2)
    threads = StepThreads.from_env()
    assert (threads.most, threads.fixed) == (2, None)
    assert threads.count == 2
    threads.use()
    assert torch.get_num_threads() == 2
    torch.set_num_threads(3)  # changed behind its back: set again
    threads.use()
    assert torch.get_num_threads() == 2


def test_a_new_engine_sees_the_pool_the_process_asked_for(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(ENV, raising=False)
    torch.set_num_threads(2)
    monkeypatch.setenv(ENV, "1")
    StepThreads.from_env().use()  # an earlier engine pinned to 1: the pool is now 1
    monkeypatch.delenv(ENV)
    assert torch.get_num_threads() == 1
    assert StepThreads.from_env().most == 2
    torch.set_num_threads(3)  # the process's own choice since
    assert StepThreads.from_env().most == 3


def test_the_environment_pins_a_count(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV, "2")
    threads = StepThreads.from_env()
    assert threads.count == 2
    for bad in ("0", "two", "-1"):
        monkeypatch.setenv(ENV, bad)
        with pytest.raises(ValueError, match=ENV):
            StepThreads.from_env()
