"""The consumer's ``Reader`` with a scripted agent: a finished load notifies its producer at
the end of the engine step after the one that reported it (after a forward used its KV), and
``has_pending`` covers it until then;
UCX error-mode settings are checked and the environment overrides the option."""

from __future__ import annotations

import re
from typing import Any

import pytest
import torch

from hybridkv.connectors.nixl.agent import XferState, ucx_params
from hybridkv.connectors.nixl.handshake import Peer
from hybridkv.connectors.nixl.layout import GroupDesc, LayoutDescriptor
from hybridkv.connectors.nixl.meta import Lease, RemoteSource
from hybridkv.connectors.nixl.options import NixlOptions
from hybridkv.connectors.nixl.reader import Reader
from hybridkv.connectors.nixl.stats import Flow, NixlStats
from hybridkv.connectors.stats import StatsCounter
from hybridkv.step_io import LoadSpec

BLOCK, TOKEN_BYTES, LAYERS = 16, 64, 2


def descriptor(name: str, base: int) -> LayoutDescriptor:
    page = 2 * BLOCK * TOKEN_BYTES
    return LayoutDescriptor(
        engine_id=name, compat="t", block_size=BLOCK, layer_page_bytes=page,
        backing=tuple(base + i * (1 << 20) for i in range(LAYERS)),
        groups=(GroupDesc("full_attention", 0, LAYERS, TOKEN_BYTES),), state_tensors=(),
        staging_base=0, staging_stride=0, agent_metadata=b"", lease_base=base - 64,
        lease_words=4, model_id="t:t:t", num_blocks=64,
    )  # fmt: skip


class ScriptedAgent:
    """Reads complete in their post; the lease word reads ``word``; notifications recorded."""

    def __init__(self, word: int) -> None:
        self.word = word
        self.sent: list[tuple[str, bytes]] = []
        self.reader: Reader | None = None

    def prepare(self, remote: str | None, regions: list[tuple[int, int]]) -> str:
        return "prepared"

    def read(self, remote: str, rows: Any, notif: bytes) -> tuple[str, XferState]:
        assert notif == b""  # reads carry no notification
        return "data", XferState.DONE

    def read_prepared(
        self, local: Any, local_index: int, far: Any, far_index: int
    ) -> tuple[str, XferState]:
        assert self.reader is not None
        self.reader.scratch[local_index] = self.word
        return "lease", XferState.DONE

    def state(self, handle: Any) -> XferState:
        return XferState.DONE

    def release(self, handle: Any) -> bool:
        return True

    def notify(self, remote: str, message: bytes) -> None:
        self.sent.append((remote, message))


class OnePeer:
    def __init__(self) -> None:
        self.peer = Peer(descriptor("producer", 1 << 30), "producer-agent", "leases")

    def get(self, source: RemoteSource) -> Peer:
        return self.peer

    def forget(self, source: RemoteSource) -> None:
        pass


def load(rid: str, tokens: int, gen: int = 1) -> LoadSpec:
    blocks = list(range(1, -(-tokens // BLOCK) + 1))
    src = RemoteSource("producer", "127.0.0.1", 1, rid, (tuple(blocks),), (0,), None, tokens, Lease(0, gen))  # fmt: skip
    return LoadSpec(rid, 0, tokens, (blocks,), (list(range(len(blocks))),), (), True, src)


def reader(word: int) -> tuple[Reader, ScriptedAgent, StatsCounter[NixlStats]]:
    agent = ScriptedAgent(word)
    stats = StatsCounter(NixlStats)
    scratch = torch.zeros(8, dtype=torch.int64)
    r = Reader(NixlOptions(), agent, OnePeer(), descriptor("consumer", 1 << 20), stats, scratch)  # type: ignore[arg-type]  # fmt: skip
    agent.reader = r
    return r, agent, stats


def test_a_finished_load_notifies_a_step_later() -> None:
    r, agent, stats = reader(word=1)
    r.add(load("a", 40), 0.0)
    assert r.progress()  # the load ends inside this call
    assert [d.request_id for d in r.done] == ["a"] and r.done[0].request_reason is None
    assert not r.progress()
    assert r.end_step() == 0  # the step that reported it: not yet
    assert agent.sent == [] and r.has_pending()
    assert r.end_step() == 1  # the next step's end (its forward used the KV): sent
    assert agent.sent == [("producer-agent", f"a:{40 * 2 * TOKEN_BYTES * LAYERS}".encode())]
    assert not r.has_pending() and r.end_step() == 0
    s = stats.take()
    assert s.nbytes[Flow.LOAD] == 40 * 2 * TOKEN_BYTES * LAYERS and s.transfers[Flow.LOAD] == 1


def test_an_expired_lease_fails_and_never_notifies() -> None:
    r, agent, _ = reader(word=2)  # the slot was reused by a newer lease
    r.add(load("b", 20, gen=1), 0.0)
    r.progress()
    assert r.done[0].request_reason is not None
    assert r.done[0].request_reason.startswith("nixl_lease_expired")
    assert not r.has_pending()
    r.end_step()
    r.end_step()
    assert agent.sent == []


def test_several_loads_notify_together_by_the_step_that_reported_them() -> None:
    r, agent, _ = reader(word=1)
    for rid in ("x", "y", "z"):
        r.add(load(rid, 17), 0.0)
    r.progress()
    assert len(r.done) == 3
    r.end_step()
    r.add(load("w", 17), 0.0)  # finishes a step later: due a step later
    r.progress()
    assert agent.sent == []
    r.end_step()
    assert [m.split(b":")[0] for _, m in agent.sent] == [b"x", b"y", b"z"]
    r.end_step()
    assert [m.split(b":")[0] for _, m in agent.sent] == [b"x", b"y", b"z", b"w"]


def test_ucx_error_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HYBRIDKV_NIXL_UCX_ERROR_MODE", raising=False)
    assert ucx_params() == {"ucx_error_handling_mode": "peer"}
    assert ucx_params("none") == {"ucx_error_handling_mode": "none"}
    monkeypatch.setenv("HYBRIDKV_NIXL_UCX_ERROR_MODE", "none")
    assert ucx_params("peer") == {"ucx_error_handling_mode": "none"}  # the environment wins
    monkeypatch.setenv("HYBRIDKV_NIXL_UCX_ERROR_MODE", "fast")
    with pytest.raises(ValueError, match="ucx_error_handling_mode='fast'"):
        ucx_params()
    message = "ucx_error_handling_mode='fast' must be 'peer' or 'none'"
    with pytest.raises(ValueError, match=re.escape(message)):
        NixlOptions.parse({"ucx_error_handling_mode": "fast"})
