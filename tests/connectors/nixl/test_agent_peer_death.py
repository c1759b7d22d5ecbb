"""A producer process killed while a NIXL READ of its memory is running: the consumer's read
ends in an error (never reported DONE), its handle is released, and the same agent then reads
from a new producer correctly. This is what the NixlConnector's worker relies on to fail the
load into recovery (recompute or ``fail``) instead of serving half-landed blocks."""

from __future__ import annotations

import base64
import subprocess
import sys
import threading
import time

import pytest
import torch

from hybridkv.connectors.nixl.agent import NixlAgent, XferState

PEER = """
import base64, sys, torch
from hybridkv.connectors.nixl.agent import NixlAgent
n = int(sys.argv[1])
buf = torch.full((n,), int(sys.argv[2]), dtype=torch.uint8)
agent = NixlAgent(sys.argv[3])
agent.register([(buf.data_ptr(), n)])
print("ready", buf.data_ptr(), base64.b64encode(agent.metadata()).decode(), flush=True)
sys.stdin.read()
"""


class Peer:
    """A process holding ``nbytes`` of ``fill`` registered with its own NIXL agent."""

    def __init__(self, nbytes: int, fill: int, name: str) -> None:
        cmd = [sys.executable, "-c", PEER, str(nbytes), str(fill), name]
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        for line in self.proc.stdout:  # NIXL may log to stdout before we print
            if line.startswith("ready "):
                _, addr, meta = line.split()
                self.addr, self.metadata = int(addr), base64.b64decode(meta)
                return
        raise RuntimeError("the peer process did not start")

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(30)


def read_until_end(agent: NixlAgent, peer: str, descs: list[tuple[int, int, int]]) -> XferState:
    """Post and poll a read; a post that raises counts as ``ERR`` (after releasing)."""
    try:
        handle, state = agent.read(peer, descs, b"")
    except Exception:  # noqa: BLE001 - NIXL raises its own error types
        return XferState.ERR
    deadline = time.monotonic() + 60
    while state is XferState.PROC and time.monotonic() < deadline:
        time.sleep(0.001)
        state = agent.state(handle)
    assert agent.release(handle)
    return state


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_peer_killed_during_a_read_fails_it_and_the_agent_reads_on() -> None:
    nbytes = 1 << 30  # long enough (>= ~0.1 s at memory speed) for the kill to land inside
    local = torch.zeros(nbytes, dtype=torch.uint8)
    agent = NixlAgent("consumer")
    agent.register([(local.data_ptr(), nbytes)])
    dying = Peer(nbytes, 7, "dying")
    try:
        peer = agent.add_remote(dying.metadata)
        killer = threading.Timer(0.01, dying.proc.kill)
        killer.start()
        state = read_until_end(agent, peer, [(local.data_ptr(), dying.addr, nbytes)])
        killer.join()
        assert state is XferState.ERR  # never DONE over half-landed bytes
        agent.remove_remote(peer)
    finally:
        dying.close()
    fresh = Peer(1 << 20, 9, "fresh")
    try:
        peer = agent.add_remote(fresh.metadata)
        state = read_until_end(agent, peer, [(local.data_ptr(), fresh.addr, 1 << 20)])
        assert state is XferState.DONE
        assert bool((local[: 1 << 20] == 9).all())
    finally:
        fresh.close()
