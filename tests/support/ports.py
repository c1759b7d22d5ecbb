"""Free TCP ports for test servers, picked where nothing else will take them first.

A port from ``bind(("127.0.0.1", 0))`` lies in the kernel's ephemeral range, where every
outgoing connection also takes its local port: UCX's tcp connections (NIXL under
``ucx_error_handling_mode=peer``), HTTP clients, other test processes. Between the pick and
the server's own bind such a port can be taken ("Address already in use"). Ports below that
range are handed out only by explicit binds, so this picks one there at random, checks it binds,
and never hands out the same port twice in a process.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

_LOWEST = 10000
_handed_out: set[int] = set()


def _ephemeral_start() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _binds(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port() -> int:
    top = _ephemeral_start()
    if top > _LOWEST + 1000:  # else no room below the ephemeral range: let the kernel pick
        for _ in range(200):
            port = random.randrange(_LOWEST, top)
            if port not in _handed_out and _binds(port):
                _handed_out.add(port)
                return port
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
