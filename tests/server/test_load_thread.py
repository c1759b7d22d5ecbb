"""``hybridkv serve`` loads the model on a thread that ends: the main thread keeps no OpenMP
pool, so the engine thread's pool is the process's only one and libgomp keeps spinning between
a decode step's kernel calls (with a second, idle pool it throttled the spin and every native
call waited for a futex wake-up: one stream decoded at half ``LLM.generate``'s speed)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from hybridkv.server import launch
from tests.support.checkpoints import SharedCheckpoints

CODE = """
import os, sys
import hybridkv.engine.core  # torch and the engine imported: the threads imports start
from hybridkv.server.launch import ServeOptions, build_state
before = len(os.listdir("/proc/self/task"))
build_state(ServeOptions(model=sys.argv[1], engine_options={"kv_cache_memory": "64MiB"}))
import time
for _ in range(600):  # the loading thread's OpenMP workers exit after it, asynchronously
    if len(os.listdir("/proc/self/task")) <= before:
        break
    time.sleep(0.05)
print(before, len(os.listdir("/proc/self/task")))
"""


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="needs Linux's /proc")
def test_loading_leaves_no_thread_behind(shared_checkpoints: SharedCheckpoints) -> None:
    """In a fresh interpreter: as many threads after loading as before, once the loading
    thread's OpenMP workers have exited (the engine thread is created, not started). Loading
    on the main thread left its OpenMP worker running for good."""
    model = shared_checkpoints.get("granitemoehybrid")
    res = subprocess.run(
        [sys.executable, "-c", CODE, str(model)], capture_output=True, text=True, timeout=300
    )
    assert res.returncode == 0, res.stderr[-2000:]
    before, after = map(int, res.stdout.split())
    assert after == before


def test_the_passing_thread_returns_raises_and_ends() -> None:
    import threading

    seen: list[threading.Thread] = []

    def work(x: int) -> int:
        seen.append(threading.current_thread())
        return x + 1

    assert launch._in_passing_thread(work, 41) == 42
    assert seen[0] is not threading.main_thread() and not seen[0].is_alive()
    with pytest.raises(KeyError, match="nope"):
        launch._in_passing_thread({}.__getitem__, "nope")
