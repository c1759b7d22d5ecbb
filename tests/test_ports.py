"""The test servers' port picker: bindable, below the ephemeral range, never twice."""

from __future__ import annotations

import socket

from tests.support import ports


def test_ports_are_distinct_bindable_and_below_the_ephemeral_range() -> None:
    picked = [ports.free_port() for _ in range(50)]
    assert len(set(picked)) == len(picked)
    top = ports._ephemeral_start()
    for port in picked:
        if top > ports._LOWEST + 1000:
            assert ports._LOWEST <= port < top
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))  # still free


def test_a_taken_port_does_not_count_as_free() -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        taken = busy.getsockname()[1]
        assert not ports._binds(taken)
