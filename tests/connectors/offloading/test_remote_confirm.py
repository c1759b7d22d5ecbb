"""Values the server lost after they were indexed (item 2 of issue 12), on a real
``valkey-server``: a lookup confirms the units it would report (one pipelined ``EXISTS``) and
reports only the run before the first incomplete one; a value lost between the lookup and the
load is a counted ``missing`` failure of that unit's blocks only, and the next lookup reports
the prefix before it."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from hybridkv.connectors.offloading.tiers.remote import checks as remote_checks
from tests.connectors.helpers import FakeRequest, make_layout, make_request, table
from tests.support.valkey_server import ValkeyProcess, running_valkey

from .helpers import OffloadEngine, offload_config
from .test_remote_tier import remote, settle

pytestmark = [pytest.mark.slow, pytest.mark.timeout(60)]

# "full" layout (one full-attention group), C = 8: a 26-token prompt's units end at 8, 16, 24
SRC = {0: [1, 2, 3, 4, 5, 6, 7]}
DST = {0: [21, 22, 23, 24, 25, 26, 27]}


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ValkeyProcess]:
    with running_valkey(tmp_path / "valkey") as proc:
        yield proc


def engine(server: ValkeyProcess, seed: int, **extra: object) -> OffloadEngine:
    config = offload_config(cpu=None, remote=server.url, remote_timeout_seconds=0.5, **extra)
    return OffloadEngine(config, make_layout("full"), seed=seed)


def stored(e: OffloadEngine) -> FakeRequest:
    req = make_request("a", 26)
    e.save_prompt(req, table(e.layout, SRC), [8, 16, 24, 26])
    assert e.counters()["stores.remote"] == 3
    return req


def later(e: OffloadEngine, seconds: float) -> None:
    """Move the tier's clock on: its confirmations grow old."""
    remote(e).clock = lambda: time.monotonic() + seconds


def unit_key(e: OffloadEngine, req: FakeRequest, end: int) -> str:
    return remote(e).unit_keys(req.block_hashes[end // 4 - 1], end)[-1]


def test_a_lookup_reports_only_the_run_the_server_still_holds(server: ValkeyProcess) -> None:
    a = engine(server, seed=1)
    req = stored(a)
    server.client().delete(unit_key(a, req, 16))  # evicted after this process indexed it
    asked = FakeRequest("q", req.all_token_ids)
    assert a.scheduler.get_num_new_matched_tokens(asked, 0) == (24, True)  # just written
    later(a, 2 * remote_checks.CONFIRM_SECONDS)
    assert a.scheduler.get_num_new_matched_tokens(asked, 0) is None  # confirming
    assert settle(a, req) == (8, True)  # the run before the lost unit, nothing failed
    counters = a.counters()
    assert counters["confirm_missing"] == 1 and counters.get("load_failures:missing", 0) == 0
    assert remote(a).index.get(req.block_hashes[3]) is None  # left the index
    num, _, _ = a.load(FakeRequest("l", req.all_token_ids), table(a.layout, DST))
    assert num == 8
    out = a.finish("l")
    assert not out.invalid_block_ids and not out.failed_recving
    assert torch.equal(a.blocks_bytes(DST[0][:2]), a.blocks_bytes(SRC[0][:2]))
    a.assert_clean()


def test_one_round_trip_confirms_a_run_for_a_while(server: ValkeyProcess) -> None:
    a = engine(server, seed=1)
    req = stored(a)
    later(a, 2 * remote_checks.CONFIRM_SECONDS)
    assert settle(a, req) == (24, True)
    server.client().delete(unit_key(a, req, 24))  # within CONFIRM_SECONDS: not seen yet
    assert a.scheduler.get_num_new_matched_tokens(FakeRequest("q", req.all_token_ids), 0) == (
        24,
        True,
    )


def test_a_value_lost_after_the_lookup_fails_only_its_unit(server: ValkeyProcess) -> None:
    """The load writes units 1 and 3 and reports unit 2's blocks invalid (a full-attention
    request resumes from there); the unit leaves the index, so the next lookup reports 8."""
    a, b = engine(server, seed=1), engine(server, seed=2)
    req = stored(a)
    assert settle(b, req) == (24, True)
    server.client().delete(unit_key(b, req, 16))
    num, _, _ = b.load(FakeRequest("l", req.all_token_ids), table(b.layout, DST))
    assert num == 24
    out = b.finish("l")
    assert sorted(out.invalid_block_ids) == [23, 24]  # unit 2's blocks, nothing else
    assert not out.failed_recving
    good = [0, 1, 4, 5]
    assert torch.equal(
        b.blocks_bytes([DST[0][i] for i in good]), a.blocks_bytes([SRC[0][i] for i in good])
    )
    counters = b.counters()
    assert counters["load_failures:missing"] == 1 and counters["removed.remote"] == 1
    assert settle(b, req) == (8, True)
    b.assert_clean()


def test_a_server_down_confirms_nothing(server: ValkeyProcess) -> None:
    a = engine(server, seed=1)
    req = stored(a)
    server.kill()
    later(a, 2 * remote_checks.CONFIRM_SECONDS)
    began = time.monotonic()
    assert settle(a, req) == (0, False)  # a miss, within the command timeout
    assert time.monotonic() - began < 3
    assert a.counters()["remote_errors"] >= 1
    a.assert_clean()
