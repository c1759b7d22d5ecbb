"""A step's KV events go out before its outputs, and the evictions its scheduling made before
its forward: the batches up to the sequence number an output carries (``usage.
kv_events_seq``) rebuild the engine's prefix map as it was when the output was made, and the
batches published when the forward starts rebuild the map as scheduling left it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import zmq

from hybridkv import LLM, SamplingParams
from hybridkv.kv_events.schema import MEDIUM_DEVICE
from tests.e2e_offload.helpers import make_llm
from tests.kv_events.vllm_schema import CacheIndex, Entry
from tests.support.checkpoints import SharedCheckpoints
from tests.support.prompts import random_ids

pytestmark = pytest.mark.slow

PREFIXES = [random_ids(64, 700 + k) for k in range(3)]
PROMPTS = [PREFIXES[i % 3] + random_ids(24 + 5 * i, 800 + i) for i in range(8)]


def device_view(llm: LLM) -> set[Entry]:
    kv = llm.engine.kv
    view: set[Entry] = {(g, MEDIUM_DEVICE, h) for h, g in kv.pool.cached}
    for sm in kv.state:
        view |= {(g, MEDIUM_DEVICE, h) for h, g in sm.pool.cached}
    return view


def replay_all(endpoint: str) -> dict[int, bytes]:
    dealer = zmq.Context.instance().socket(zmq.DEALER)
    dealer.connect(endpoint)
    dealer.send_multipart((b"", (0).to_bytes(8, "big")))
    out: dict[int, bytes] = {}
    try:
        while True:
            assert dealer.poll(5000), "no replay answer"
            _, _, seq, payload = dealer.recv_multipart()
            if int.from_bytes(seq, "big", signed=True) == -1:
                return out
            out[int.from_bytes(seq, "big")] = payload
    finally:
        dealer.close(linger=0)


def rebuilt(batches: dict[int, bytes], last_seq: int) -> set[Entry]:
    index = CacheIndex()
    for seq in range(last_seq + 1):
        index.apply(batches[seq])  # no gap: every batch up to the seq was published
    return index.entries


def test_events_of_a_step_come_before_its_forward_and_its_outputs(
    shared_checkpoints: SharedCheckpoints, tmp_path: Path
) -> None:
    replay = f"ipc://{tmp_path}/replay.sock"
    events = {"enable_kv_cache_events": True, "endpoint": f"ipc://{tmp_path}/pub.sock",
              "replay_endpoint": replay, "heartbeat_seconds": 0}  # fmt: skip
    llm = make_llm(shared_checkpoints.get("granitemoehybrid"), None, kv_cache_memory="400KiB",
                   max_model_len=256, max_num_seqs=2, num_state_slots=6,
                   kv_events_config=events)  # fmt: skip
    engine, collector = llm.engine, llm.engine.kv_events
    assert collector is not None
    at_forward: list[tuple[int, set[Entry]]] = []
    execute = engine.runner.execute

    def recording_execute(out: Any) -> Any:
        at_forward.append((collector.last_seq, device_view(llm)))
        return execute(out)

    engine.runner.execute = recording_execute  # type: ignore[method-assign]
    params = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
    for prompt in PROMPTS:
        engine.add_request(prompt, params)
    at_output: list[tuple[int, set[Entry]]] = []
    while engine.has_unfinished_requests():
        outputs = engine.step()
        for out in outputs:
            assert out.kv_events_seq == collector.last_seq
        if outputs:
            assert outputs[0].kv_events_seq is not None
            at_output.append((outputs[0].kv_events_seq, device_view(llm)))
    assert collector.flush(5.0)
    batches = replay_all(replay)
    removed = CacheIndex()
    for seq in sorted(batches):
        removed.apply(batches[seq])
    assert removed.num_removed.get(MEDIUM_DEVICE, 0) > 0, "the device pool should evict"
    assert len(at_forward) > len(PROMPTS) and at_output
    for seq, view in at_forward + at_output:
        assert rebuilt(batches, seq) == view
