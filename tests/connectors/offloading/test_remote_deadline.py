"""A load's one deadline across all its remote commands (item 3 of issue 12), on a real
``valkey-server`` paused with ``CLIENT PAUSE``: a synchronous load gives up at
``load_timeout_seconds`` even though each command may wait ``remote_timeout_seconds``
(longer here); its reads stop then too, it is a counted timeout, the unit stays indexed and
the server is not marked down; once the server answers again the same prefix loads."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.connectors.helpers import FakeRequest, make_layout, make_request, table
from tests.support.valkey_server import ValkeyProcess, running_valkey

from .helpers import DST, SRC, OffloadEngine, offload_config
from .test_remote_tier import remote, settle

pytestmark = [pytest.mark.slow, pytest.mark.timeout(60)]

LOAD_TIMEOUT = 0.6
PAUSE_MS = 3000


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ValkeyProcess]:
    with running_valkey(tmp_path / "valkey") as proc:
        yield proc


def engine(server: ValkeyProcess, seed: int) -> OffloadEngine:
    config = offload_config(
        cpu=None,
        remote=server.url,
        remote_timeout_seconds=10,  # per command: far past the load's deadline
        load_timeout_seconds=LOAD_TIMEOUT,
        load_mode="sync",
    )
    return OffloadEngine(config, make_layout("hybrid"), seed=seed)


def test_a_paused_server_times_a_sync_load_out_as_a_whole(server: ValkeyProcess) -> None:
    a, b = engine(server, seed=1), engine(server, seed=2)
    req = make_request("a", 18)
    a.save_prompt(req, table(a.layout, SRC, {2: 0}), [8, 16, 18])
    assert settle(b, req) == (16, False)  # confirmed: the next lookup asks nothing
    pool = remote(b).pool  # the read-ahead's two connections exist before the pause
    for conn in [pool.get_connection("PING") for _ in range(2)]:
        pool.release(conn)
    server.client().execute_command("CLIENT", "PAUSE", PAUSE_MS, "ALL")
    began = time.monotonic()
    num, is_async, _ = b.load(FakeRequest("l", req.all_token_ids), table(b.layout, DST, {2: 3}))
    waited = time.monotonic() - began
    assert (num, is_async) == (16, False)
    assert LOAD_TIMEOUT <= waited < LOAD_TIMEOUT + 1.0  # the step waited for the deadline only
    out = b.worker.get_finished([])
    assert out.failed_recving == {"l": "timeout"}
    while remote(b).index.num_pinned():  # the reads stop at the deadline, not per command
        assert time.monotonic() - began < PAUSE_MS / 1000 - 0.5, "reads outlived the deadline"
        time.sleep(0.02)
    counters = b.counters()
    assert counters["load_failures:timeout"] >= 1 and counters["timeouts"] == 1
    assert counters.get("remote_errors", 0) == 0 and not remote(b).is_down()
    assert remote(b).index.get(req.block_hashes[3]) is not None  # too slow is not bad
    time.sleep(max(0.0, began + PAUSE_MS / 1000 - time.monotonic()) + 0.2)
    assert settle(b, req) == (16, False)
    num, _, _ = b.load(FakeRequest("m", req.all_token_ids), table(b.layout, DST, {2: 3}))
    out = b.worker.get_finished([])
    assert num == 16 and not out.failed_recving and not out.invalid_block_ids
    b.assert_clean()
    a.assert_clean()
