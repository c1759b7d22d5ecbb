"""The remote tier on a real ``valkey-server`` (started per test on a free loopback port): two
engines sharing it, corrupt and vanished values, the server down and back."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from hybridkv.connectors.offloading.tiers.remote import tier as remote_tier
from hybridkv.connectors.offloading.tiers.remote.key import ENV_KEY
from hybridkv.connectors.offloading.tiers.remote.tier import RemoteTier
from tests.connectors.helpers import FakeRequest, make_layout, make_request, table
from tests.support.valkey_server import ValkeyProcess, running_valkey
from tests.support.waits import wait_for

from .helpers import DST, SRC, OffloadEngine, offload_config

pytestmark = [pytest.mark.slow, pytest.mark.timeout(60)]


@pytest.fixture
def server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[ValkeyProcess]:
    monkeypatch.setenv(ENV_KEY, "a deployment key for tests")
    with running_valkey(tmp_path / "valkey") as proc:
        yield proc


def engine(
    server: ValkeyProcess, seed: int, cpu: str | None = None, **extra: object
) -> OffloadEngine:
    config = offload_config(cpu=cpu, remote=server.url, remote_timeout_seconds=0.5, **extra)
    return OffloadEngine(config, make_layout("hybrid"), seed=seed)


def remote(e: OffloadEngine) -> RemoteTier:
    tier = e.sched.stack.get("remote")
    assert isinstance(tier, RemoteTier)
    return tier


def store(a: OffloadEngine) -> FakeRequest:
    req = make_request("a", 18)
    a.save_prompt(req, table(a.layout, SRC, {2: 0}), [8, 16, 18])
    return req


def lookup(e: OffloadEngine, req: FakeRequest) -> tuple[int, bool] | None:
    return e.scheduler.get_num_new_matched_tokens(FakeRequest("q", req.all_token_ids), 0)


def settle(e: OffloadEngine, req: FakeRequest) -> tuple[int, bool]:
    """Lookups until the tiers answer (remote probes run on a worker), a step between each."""

    def answered() -> tuple[int, bool] | None:
        found = lookup(e, req)
        if found is None:
            e.scheduler.build_connector_meta([])
        return found

    return wait_for(answered, 5, what="the remote tier to answer the lookup")


def load(b: OffloadEngine, req: FakeRequest, expect: int) -> dict[str, float]:
    probe = FakeRequest("l", req.all_token_ids)
    num, _, _ = b.load(probe, table(b.layout, DST, {2: 3}))
    assert num == expect
    out = b.finish("l")
    counters = b.counters()
    counters["invalid"] = len(out.invalid_block_ids) + len(out.invalid_state)
    return counters


def test_a_second_engine_loads_what_the_first_stored(server: ValkeyProcess) -> None:
    a, b = engine(server, seed=1, cpu="1MiB"), engine(server, seed=2)
    req = store(a)
    assert a.counters()["stores.remote"] == 2  # written through behind the CPU tier
    want = a.blocks_bytes([1, 2, 3, 4, 8, 9]).clone(), a.state_bytes(0).clone()
    assert lookup(b, req) is None  # probing the server on its worker: ask again
    assert settle(b, req) == (16, True)
    counters = load(b, req, 16)
    assert counters["adopted.remote"] == 2 and counters["hits.remote"] == 2
    assert counters["invalid"] == 0
    assert b.scheduler.get_hit_sources(FakeRequest("l", req.all_token_ids), 16) == {"remote": 16}
    assert torch.equal(b.blocks_bytes([11, 12, 13, 14, 16, 17]), want[0])
    assert torch.equal(b.state_bytes(3), want[1])
    keys = server.client().keys("*")  # keyed names: neither the model nor a hash shows
    assert keys and all(re.fullmatch(rb"hybridkv:[0-9a-f]{40}:[0-9]+", k) for k in keys)
    assert not any(h.hex().encode() in k for h in req.block_hashes for k in keys)
    a.assert_clean()
    b.assert_clean()


def test_values_are_cut_into_several_keys(
    server: ValkeyProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(remote_tier, "VALUE_BYTES", 1000)  # parts of 2-4 KiB: 3-5 values each
    a, b = engine(server, seed=1), engine(server, seed=2)
    req = store(a)
    assert len(server.client().keys("*")) > 2 * 3  # more values than parts
    assert settle(b, req) == (16, True)
    assert load(b, req, 16)["invalid"] == 0
    b.assert_clean()


def test_a_flipped_byte_is_a_counted_recompute_and_the_unit_is_deleted(
    server: ValkeyProcess,
) -> None:
    a, b = engine(server, seed=1), engine(server, seed=2)
    req = store(a)
    tail = remote(b).unit_keys(req.block_hashes[3], 16)
    client = server.client()
    value = client.get(tail[-1])  # a payload value (value 0 is the header)
    assert value is not None
    client.setrange(tail[-1], len(value) - 5, bytes([value[-5] ^ 1]))
    assert settle(b, req) == (16, True)
    counters = load(b, req, 16)
    assert counters["load_failures:corrupt"] >= 1 and counters["invalid"] >= 1
    assert counters["removed.remote"] == 1 and counters["values_removed"] == len(tail)
    assert client.exists(*tail) == 0  # the bad unit's values are gone, the head's stay
    assert client.exists(*remote(b).unit_keys(req.block_hashes[1], 8)) > 0
    b.assert_clean()


def test_a_value_evicted_after_the_lookup_is_a_counted_missing_load(
    server: ValkeyProcess,
) -> None:
    a, b = engine(server, seed=1), engine(server, seed=2)
    req = store(a)
    assert settle(b, req) == (16, True)
    server.client().delete(remote(b).unit_keys(req.block_hashes[3], 16)[-1])
    counters = load(b, req, 16)
    assert counters["load_failures:missing"] == 1 and counters["invalid"] == 1
    b.assert_clean()


def test_an_incomplete_unit_is_not_reported(server: ValkeyProcess) -> None:
    a, b = engine(server, seed=1), engine(server, seed=2)
    req = store(a)
    server.client().delete(remote(b).unit_keys(req.block_hashes[3], 16)[0])
    assert settle(b, req) == (8, True)  # the tail lost a value: only the head is found
    assert load(b, req, 8)["invalid"] == 0
    b.assert_clean()


def test_the_server_down_then_back(server: ValkeyProcess) -> None:
    a = engine(server, seed=1, cpu="1MiB")
    server.kill()
    began = time.monotonic()
    req = store(a)  # written to CPU; the remote writes fail fast and are dropped
    assert time.monotonic() - began < 3
    counters = a.counters()
    assert counters["stores.cpu"] == 2 and counters["store_failures.remote"] == 2
    assert counters["remote_errors"] >= 1
    b = engine(server, seed=2)
    began = time.monotonic()
    assert settle(b, req) == (0, False)  # a miss, never a wait past the timeout
    assert time.monotonic() - began < 3
    server.start()  # an empty server on the same port
    time.sleep(remote_tier.RETRY_SECONDS)
    req2 = make_request("a2", 18, first_token=100)
    a.save_prompt(req2, table(a.layout, SRC, {2: 0}), [8, 16, 18])
    assert a.counters()["stores.remote"] == 2  # reconnected by itself
    b.sched.stack.get("remote").clock = lambda: time.monotonic() + 10  # type: ignore[union-attr]
    assert settle(b, req2) == (16, True)
    assert load(b, req2, 16)["invalid"] == 0
    a.assert_clean()
    b.assert_clean()


@pytest.mark.parametrize("change", [b"xyz", b"x" * 5000])
def test_a_value_of_another_size_is_refused_and_deleted(
    server: ValkeyProcess, monkeypatch: pytest.MonkeyPatch, change: bytes
) -> None:
    """The reply reader receives payload values into one array of the part's size; a value
    shorter or longer than the writer cut is kept apart and the verification refuses it."""
    monkeypatch.setattr(remote_tier, "VALUE_BYTES", 1000)
    a, b = engine(server, seed=1), engine(server, seed=2)
    req = store(a)
    tail = remote(b).unit_keys(req.block_hashes[3], 16)
    assert settle(b, req) == (16, True)
    server.client().append(tail[2], change)  # a middle value grows
    counters = load(b, req, 16)
    assert counters["load_failures:corrupt"] == 1 and counters["invalid"] >= 1
    assert server.client().exists(*tail) == 0
    b.assert_clean()
