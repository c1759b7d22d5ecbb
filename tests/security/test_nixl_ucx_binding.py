"""Issue 26, finding 4: UCX listened on the external interface whatever ``side_channel_host``
said. A single-host deployment's agent now listens on loopback only (``UCX_NET_DEVICES=lo``,
set by ``agent.net_devices``), checked with ``ss`` on a fresh process."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from hybridkv.connectors.nixl.agent import net_devices

PROBE = """
import os, subprocess, sys
from hybridkv.connectors.nixl.agent import NixlAgent, net_devices
agent = NixlAgent("probe", True, "peer", net_devices(None, sys.argv[1] == "single"))
agent.metadata()
out = subprocess.run(["ss", "-Htlnp"], capture_output=True, text=True).stdout
print("\\n".join(l.split()[3] for l in out.splitlines() if f"pid={os.getpid()}," in l))
"""


def listening(mode: str) -> list[str]:
    env = {k: v for k, v in os.environ.items() if k != "UCX_NET_DEVICES"}
    out = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True,
                         env=env, timeout=60, check=True)  # fmt: skip
    return [a for a in out.stdout.split() if a]


def is_loopback(address: str) -> bool:
    host = address.rpartition(":")[0].strip("[]")
    return host.startswith("127.") or host == "::1"


@pytest.mark.skipif(shutil.which("ss") is None, reason="needs ss (iproute2)")
def test_a_single_host_agent_listens_on_loopback_only() -> None:
    single = listening("single")
    assert single and all(is_loopback(a) for a in single), single


def test_the_device_choice() -> None:
    env = os.environ.pop("UCX_NET_DEVICES", None)
    try:
        assert net_devices(None, True) == "lo" and net_devices(None, False) is None
        assert net_devices("eth1", True) == "eth1"
        os.environ["UCX_NET_DEVICES"] = "mlx5_0:1"
        assert net_devices("eth1", True) is None  # the user's environment wins (UCX reads it)
    finally:
        os.environ.pop("UCX_NET_DEVICES", None)
        if env is not None:
            os.environ["UCX_NET_DEVICES"] = env
