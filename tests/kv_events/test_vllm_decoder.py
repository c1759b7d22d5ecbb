"""vLLM 0.32's own ``KVEventBatch`` decoder (``vllm.distributed.kv_events``), run in a
subprocess of the vLLM baseline venv, reads every message hybridkv publishes -- as the
publisher's ZMQ socket sends them: stored runs of full-attention, sliding and state groups
(a salt in ``extra_keys``, hybridkv's ``state_checkpoint_ends``), device evictions, tier
units stored and removed on every medium, ``AllBlocksCleared`` after a reset, and an idle
publisher's empty heartbeat batch -- and decodes every field it knows to the value hybridkv
meant. Skipped with the reason when no venv with vLLM is found."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import msgspec
import pytest
import zmq

from hybridkv.connectors.config import TierName
from hybridkv.connectors.tier_events import TierEvent
from hybridkv.kv.hashing import BlockHash
from hybridkv.kv_events.collector import KVEventCollector
from hybridkv.kv_events.config import KVEventsConfig
from hybridkv.kv_events.publisher import ZmqEventPublisher
from hybridkv.kv_events.schema import AllBlocksCleared, BlockRemoved, BlockStored, KVEventBatch
from tests.kv.builders import B, make_layout, run_step
from tests.kv_events.test_collector import TokenRequest, prefill

VLLM_PYTHON_ENV = "HYBRIDKV_VLLM_PYTHON"  # a python with vllm installed (the baseline venv)
VLLM_VENVS = ("/work/vllm-venv", "/work/main/.venv-vllm", "/work/main/.venv_vllm")
OWN_DECODER = msgspec.msgpack.Decoder(KVEventBatch)

# In vLLM's venv: length-prefixed payloads on stdin -> per batch, its events as vLLM decodes
# them (class name + every field of vLLM's struct), one JSON list per line.
VLLM_DECODE = """
import json, sys, msgspec
try:
    from vllm.distributed.kv_events import KVEventBatch
except ImportError as exc:
    sys.exit(f"NO_VLLM {exc}")
decoder = msgspec.msgpack.Decoder(KVEventBatch)
data = sys.stdin.buffer.read()
while data:
    size = int.from_bytes(data[:4], "big")
    batch = decoder.decode(data[4 : 4 + size])
    data = data[4 + size :]
    events = [[type(ev).__name__, msgspec.to_builtins(ev)] for ev in batch.events]
    print(json.dumps({"ts": batch.ts, "rank": batch.data_parallel_rank, "events": events}))
"""


def find_vllm_python() -> str | None:
    given = os.environ.get(VLLM_PYTHON_ENV)
    candidates = [given] if given else [str(Path(v) / "bin" / "python") for v in VLLM_VENVS]
    return next((python for python in candidates if Path(python).exists()), None)


def publish_every_kind(collectors: dict[str, KVEventCollector]) -> None:
    """Through real collectors: every event kind hybridkv sends."""
    from hybridkv.kv.coordinator import KVCacheConfig, KVCacheCoordinator

    for name, collector in collectors.items():  # granite: full + state; gemma3: + sliding
        coord = KVCacheCoordinator(
            collector.layout, KVCacheConfig(64, 8, True, 2 * B, key_events=True)
        )
        prefill(coord, TokenRequest(f"{name}-s", list(range(3 * B + 1)), cache_salt="salt"))
        steps = TokenRequest(f"{name}-b", list(range(50, 50 + 3 * B + 3)))
        for _ in range(3):  # block by block: state checkpoints at 2B and 3B
            assert run_step(coord, steps, B)
        coord.free(steps)
        for i in range(24):  # distinct prompts through a small pool: evictions
            req = TokenRequest(f"{name}-{i}", list(range(100 * i, 100 * i + 3 * B + 1)))
            prefill(coord, req)
            coord.free(req)
            collector.publish_step(coord.take_events())
    collector = collectors["granite"]
    units = [BlockHash(bytes([i]) * 32) for i in range(4)]
    for i, tier in enumerate([TierName.CPU, TierName.DISK, TierName.REMOTE, TierName.CPU]):
        parent = units[i - 1] if i else None
        collector.on_tier_event(TierEvent(True, tier, units[i], 32 * (i + 1), parent, 32))
    collector.on_tier_event(TierEvent(False, TierName.CPU, units[3], 128, units[2], 32))
    collector.publish_step([])
    collector.publish_reset(lambda: [TierEvent(True, TierName.DISK, units[1], 64, None, 32)])


def capture_wire(tmp_path: Path) -> list[bytes]:
    """The payload frames a subscriber receives: the events above, then a heartbeat."""
    endpoint = f"ipc://{tmp_path}/ev"
    publisher = ZmqEventPublisher(KVEventsConfig(True, "zmq", endpoint, heartbeat_seconds=0.2))
    collectors = {n: KVEventCollector(make_layout(n), publisher) for n in ("granite", "gemma3")}
    sub = zmq.Context.instance().socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.setsockopt(zmq.RCVTIMEO, 10_000)
    payloads: list[bytes] = []
    try:
        sub.connect(endpoint)
        sub.recv_multipart()  # a heartbeat: the subscription is live
        publish_every_kind(collectors)
        assert publisher.flush(10)
        while not payloads or OWN_DECODER.decode(payloads[-1]).events:  # up to a heartbeat
            _, _, payload = sub.recv_multipart()
            payloads.append(payload)
    finally:
        sub.close(linger=0)
        publisher.shutdown()
    return payloads


@pytest.mark.slow  # importing vllm takes 10-60 s
def test_vllms_own_decoder_reads_every_message_we_publish(tmp_path: Path) -> None:
    python = find_vllm_python()
    if python is None:
        pytest.skip(f"no vLLM baseline venv ({', '.join(VLLM_VENVS)} or ${VLLM_PYTHON_ENV})")
    payloads = capture_wire(tmp_path)
    stdin = b"".join(len(p).to_bytes(4, "big") + p for p in payloads)
    done = subprocess.run(
        [python, "-c", VLLM_DECODE], input=stdin, capture_output=True, timeout=600, check=False
    )
    if b"NO_VLLM" in done.stderr:
        pytest.skip(f"{python} has no vllm: {done.stderr.decode()[-300:]}")
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    theirs = [json.loads(line) for line in done.stdout.decode().splitlines()]
    ours = [OWN_DECODER.decode(p) for p in payloads]
    assert len(theirs) == len(ours)
    for their, our in zip(theirs, ours, strict=True):
        assert (their["ts"], their["rank"]) == (our.ts, our.data_parallel_rank)
        assert [name for name, _ in their["events"]] == [type(e).__name__ for e in our.events]
        for (_, fields), event in zip(their["events"], our.events, strict=True):
            mine = json.loads(json.dumps(msgspec.to_builtins(event)))  # tuples as lists
            assert {k: mine.get(k) for k in fields} == fields  # every field vLLM knows
    assert_every_kind_seen(ours)


def assert_every_kind_seen(batches: list[KVEventBatch]) -> None:
    events = [e for b in batches for e in b.events]
    stored = [e for e in events if isinstance(e, BlockStored)]
    assert {e.kv_cache_spec_kind for e in stored} >= {"full_attention", "sliding_window", "mamba"}
    assert any(e.extra_keys and e.extra_keys[0] == ("salt",) for e in stored)
    assert any(e.state_checkpoint_ends for e in stored)  # the extension vLLM drops
    assert {e.medium for e in stored} == {"GPU", "CPU", "DISK", "REMOTE"}
    removed = {e.medium for e in events if isinstance(e, BlockRemoved)}
    assert removed == {"GPU", "CPU"}
    assert any(isinstance(e, AllBlocksCleared) for e in events)
    assert not batches[-1].events  # the heartbeat
