"""The remote tier end to end on a real ``valkey-server``: two engine processes sharing it, a
server far smaller than the working set, and the server killed and restarted mid-run."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from hybridkv.connectors.offloading.tiers.remote import tier as remote_tier
from tests.support.valkey_server import ValkeyProcess, running_valkey

from .helpers import (
    PROMPTS,
    assert_clean,
    counters,
    generate,
    ids,
    make_llm,
    offload,
    reference,
    reset_device_cache,
)
from .test_load_and_faults import shared_prompts
from .test_restart_and_integrity import serve_in_subprocess

pytestmark = pytest.mark.slow


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ValkeyProcess]:
    with running_valkey(tmp_path / "valkey") as proc:
        yield proc


@pytest.mark.timeout(300)
@pytest.mark.parametrize("arch", ["qwen3", "gemma3", "granitemoehybrid"])
def test_a_second_process_gets_remote_hits_for_what_the_first_served(
    arch: str, checkpoints: dict[str, Path], server: ValkeyProcess
) -> None:
    model = checkpoints[arch]
    want = reference(model, PROMPTS[:2])
    a = serve_in_subprocess(model, server.url)  # process A: serves, writes through, exits
    assert a["token_ids"] == want and a["counters"]["stores.remote"] >= 4
    b = make_llm(model, offload(cpu="8MiB", remote=server.url, remote_timeout_seconds=30))
    outs = generate(b, PROMPTS[:2])  # (30 s: a loaded machine can starve valkey-server)
    assert [o.token_ids for o in outs] == want
    assert outs[0].cached_tokens["remote"] > 0
    c = counters(b)
    assert c["adopted.remote"] >= 4 and c["hits.remote"] >= 4 and c["hit_tokens.remote"] >= 128
    assert not any(k.startswith("load_failures") for k in c), c
    assert c["promotions.cpu"] >= 1  # remote hits are copied into the CPU tier
    assert_clean(b)
    b.engine.shutdown()


@pytest.mark.timeout(300)
def test_a_server_far_smaller_than_the_working_set(
    checkpoints: dict[str, Path], tmp_path: Path
) -> None:
    model = checkpoints["qwen3"]
    prompts = shared_prompts()
    want = reference(model, prompts)
    with running_valkey(tmp_path / "small", maxmemory="1300kb") as small:
        llm = make_llm(model, offload(remote=small.url), kv_cache_memory="4MiB")
        first = generate(llm, prompts)
        reset_device_cache(llm)
        second = generate(llm, prompts[::-1])[::-1]
        assert [o.token_ids for o in first] == want
        assert [o.token_ids for o in second] == want
        info = small.client().info("stats")
        c = counters(llm)
        assert info["evicted_keys"] > 0  # the server really dropped values under us
        assert c["stores.remote"] > 0
        failed = sum(v for k, v in c.items() if k.startswith("load_failures"))
        # the evictions were seen: at lookup (confirmations; most of them, as the shared
        # prefixes were written first and went first) or, within 0.5 s of a check, at load
        assert c.get("confirm_missing", 0) + failed > 0
        assert c.get("removed.remote", 0) <= failed  # every unit dropped failed a load, counted
        assert_clean(llm)
        llm.engine.shutdown()


@pytest.mark.timeout(300)
def test_the_server_killed_and_restarted_mid_run(
    checkpoints: dict[str, Path], server: ValkeyProcess
) -> None:
    model = checkpoints["granitemoehybrid"]
    late = [ids(128, 77) + ids(20, 78)]
    want = reference(model, [*PROMPTS[:3], *late])
    llm = make_llm(model, offload(remote=server.url, remote_timeout_seconds=0.5))
    assert [o.token_ids for o in generate(llm, PROMPTS[:2])] == want[:2]
    server.kill()  # the stored units are gone with it
    reset_device_cache(llm)
    outs = generate(llm, PROMPTS[:3])  # lookups confirm with the server: misses, recomputed
    assert [o.token_ids for o in outs] == want[:3]
    c = counters(llm)
    assert c["remote_errors"] >= 1 and c["misses"] >= 1  # the units stay indexed: no stores
    assert not any(k.startswith("load_failures") and k != "load_failures:io_error" for k in c)
    server.start()  # empty, on the same port
    time.sleep(remote_tier.RETRY_SECONDS)  # the last failure's pause ends: it reconnects
    assert [o.token_ids for o in generate(llm, late)] == want[3:]
    reset_device_cache(llm)
    outs = generate(llm, late)  # reconnected: the late prompt was stored, and is hit
    assert [o.token_ids for o in outs] == want[3:]
    assert outs[0].cached_tokens["remote"] >= 128
    assert_clean(llm)
    llm.engine.shutdown()
