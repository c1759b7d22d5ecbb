"""``hybridkv serve``'s end (the app's lifespan) shuts its engine down: the connector's threads
are joined and its sockets and files closed, as ``LLM.close()`` does (issue 26 finding 11).
An engine whose thread never started (the server failed before serving) is shut down too."""

from __future__ import annotations

import gc
import os
from pathlib import Path
from typing import Any

import httpx
import pytest

from hybridkv.server.app import create_app
from hybridkv.server.launch import ServeOptions, build_state
from tests.server.harness import ThreadedServer

pytestmark = pytest.mark.slow


def options(model_dir: Path, root: Path) -> ServeOptions:
    extra = {
        "chunk_tokens": 16,
        "cpu_bytes": "8MiB",
        "disk_path": str(root / "kv"),
        "disk_bytes": "16MiB",
    }
    transfer = {"kv_connector": "OffloadingConnector", "kv_connector_extra_config": extra}
    engine: dict[str, Any] = {"dtype": "float32", "kv_cache_memory": "8MiB"}
    return ServeOptions(model=str(model_dir), engine_options={**engine,
                        "kv_transfer_config": transfer})  # fmt: skip


def resources() -> tuple[int, int]:
    gc.collect()
    return len(os.listdir("/proc/self/task")), len(os.listdir("/proc/self/fd"))


def serve_once(model_dir: Path, root: Path) -> None:
    state = build_state(options(model_dir, root))
    with ThreadedServer(create_app(state)) as server:
        body = {"model": state.model_name, "prompt": "a b c d e f g h i j k", "max_tokens": 3}
        reply = httpx.post(server.url + "/v1/completions", json=body, timeout=60)
        assert reply.status_code == 200
        assert state.engine.engine.connector is not None
    assert state.engine.engine.closed


def test_the_servers_end_releases_the_connector(model_dir: Path, tmp_path: Path) -> None:
    serve_once(model_dir, tmp_path)  # warm-up: uvicorn's and torch's process-wide parts
    before = resources()
    for _ in range(3):
        serve_once(model_dir, tmp_path)
    assert resources() == before


def test_an_engine_whose_thread_never_started_is_shut_down(model_dir: Path, tmp_path: Path) -> None:
    state = build_state(options(model_dir, tmp_path))
    state.engine.stop()
    assert state.engine.engine.closed
