"""Issue 26, findings 3 and 4 at the side channel: a listener announcing 1 GiB is refused before
anything is allocated, a dripping one cannot stretch a fetch past its deadline nor hold the
handshakes of honest producers, a party without the deployment key gets no agent metadata
(and cannot pose as a producer), and another protocol version is a clear error."""

from __future__ import annotations

import socket
import struct
import threading
import time
import tracemalloc
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from functools import partial

import pytest

from hybridkv.connectors.nixl.auth import AuthKey
from hybridkv.connectors.nixl.handshake import HandshakeFailed, Peers
from hybridkv.connectors.nixl.layout import GroupDesc, LayoutDescriptor
from hybridkv.connectors.nixl.meta import Lease, RemoteSource
from hybridkv.connectors.nixl.side_channel import (
    _HELLO,
    MAC_BYTES,
    MAGIC,
    NONCE_BYTES,
    VERSION,
    SideChannelRefused,
    SideChannelServer,
    fetch,
    read_exact,
)
from hybridkv.connectors.nixl.stats import NixlStats
from hybridkv.connectors.stats import StatsCounter
from tests.connectors.nixl.signing import TEST_KEY
from tests.server.harness import free_port
from tests.support.waits import wait_for

SECRET = b'{"agent_metadata": "the producer\'s UCX worker address and rkeys"}'


@contextmanager
def listener(handle: Callable[[socket.socket], None]) -> Iterator[int]:
    """A TCP listener on a free loopback port answering each client with ``handle``."""
    sock = socket.create_server(("127.0.0.1", 0))
    sock.settimeout(0.1)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = sock.accept()
            except TimeoutError:
                continue
            threading.Thread(target=_run, args=(handle, conn), daemon=True).start()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield sock.getsockname()[1]
    finally:
        stop.set()
        thread.join()
        sock.close()


def _run(handle: Callable[[socket.socket], None], conn: socket.socket) -> None:
    with conn, suppress(OSError):
        handle(conn)


def keyed_fake(announce: int) -> Callable[[socket.socket], None]:
    """A side channel holding the key (a compromised peer) that announces ``announce`` bytes."""

    def handle(conn: socket.socket) -> None:
        deadline = time.monotonic() + 5
        read_exact(conn, _HELLO.size, deadline)
        nonce_c = read_exact(conn, NONCE_BYTES, deadline)
        nonce_s = b"s" * NONCE_BYTES
        conn.sendall(_HELLO.pack(MAGIC, VERSION) + nonce_s + TEST_KEY.mac(b"server", nonce_c, nonce_s))  # fmt: skip
        read_exact(conn, MAC_BYTES, deadline)
        conn.sendall(struct.pack(">I", announce) + b"x" * 1024)
        time.sleep(0.5)

    return handle


def peak_bytes(call: Callable[[], object]) -> int:
    tracemalloc.start()
    with suppress(OSError, SideChannelRefused):
        call()
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return peak


def test_a_1_gib_announcement_is_refused_before_allocation() -> None:
    def plain_v4(conn: socket.socket) -> None:  # the old protocol's shape: length, then bytes
        conn.sendall(struct.pack(">I", 1 << 30) + b"x" * 1024)
        time.sleep(0.5)

    for handle in (plain_v4, keyed_fake(1 << 30)):
        with listener(handle) as port:
            with pytest.raises(SideChannelRefused):
                fetch("127.0.0.1", port, 2.0, TEST_KEY)
            assert peak_bytes(lambda port=port: fetch("127.0.0.1", port, 2.0, TEST_KEY)) < 1 << 20  # type: ignore[misc]


def test_a_dripping_listener_cannot_stretch_the_deadline() -> None:
    def drip(conn: socket.socket) -> None:  # a well-formed answer, one byte at a time
        for byte in _HELLO.pack(MAGIC, VERSION) + b"n" * NONCE_BYTES:
            conn.sendall(bytes([byte]))
            time.sleep(0.1)

    with listener(drip) as port:
        started = time.monotonic()
        with pytest.raises(TimeoutError):
            fetch("127.0.0.1", port, 0.5, TEST_KEY)
        assert time.monotonic() - started < 3.0  # one deadline for the whole exchange, not per byte


def test_only_a_party_with_the_key_gets_the_descriptor() -> None:
    port = free_port()
    server = SideChannelServer("127.0.0.1", port, SECRET, TEST_KEY, timeout=2.0)
    try:
        assert fetch("127.0.0.1", port, 2.0, TEST_KEY) == SECRET
        with pytest.raises(SideChannelRefused, match="does not hold this deployment's key"):
            fetch("127.0.0.1", port, 2.0, AuthKey(b"not-the-deployment-key", "x"))
        with socket.create_connection(("127.0.0.1", port), timeout=2.0) as sock:  # a raw client
            sock.sendall(_HELLO.pack(MAGIC, VERSION) + b"n" * NONCE_BYTES)
            sock.sendall(b"m" * MAC_BYTES)  # a guessed proof
            got = _read_all(sock)
        assert len(got) == _HELLO.size + NONCE_BYTES + MAC_BYTES and SECRET not in got
    finally:
        server.close()


def _read_all(sock: socket.socket) -> bytes:
    chunks = []
    while chunk := sock.recv(4096):
        chunks.append(chunk)
    return b"".join(chunks)


def test_a_producer_without_the_key_is_refused() -> None:
    port = free_port()
    server = SideChannelServer("127.0.0.1", port, SECRET, AuthKey(b"an-impostor-producer-key", "x"))  # fmt: skip
    try:
        with pytest.raises(SideChannelRefused, match="does not hold"):
            fetch("127.0.0.1", port, 2.0, TEST_KEY)
    finally:
        server.close()


def test_another_version_is_a_clear_error() -> None:
    port = free_port()
    server = SideChannelServer("127.0.0.1", port, SECRET, TEST_KEY, timeout=2.0)
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=2.0) as sock:
            sock.sendall(_HELLO.pack(MAGIC, VERSION - 1) + b"n" * NONCE_BYTES)
            magic, version = _HELLO.unpack(read_exact(sock, _HELLO.size, time.monotonic() + 2))
            rest = _read_all(sock)
        assert (magic, version) == (MAGIC, VERSION) and SECRET not in rest
    finally:
        server.close()

    def old_server(conn: socket.socket) -> None:  # a version 4 producer: length, descriptor
        conn.sendall(struct.pack(">I", len(SECRET)) + SECRET)

    with listener(old_server) as old, pytest.raises(SideChannelRefused, match="protocol version 5"):  # fmt: skip
        fetch("127.0.0.1", old, 2.0, TEST_KEY)


class NamedAgent:
    def __init__(self) -> None:
        self.added: list[bytes] = []

    def add_remote(self, metadata: bytes) -> str:
        self.added.append(metadata)
        return "agent"

    def prepare(self, remote: str | None, regions: list[tuple[int, int]]) -> str:
        return "prepared"

    def release_prepared(self, handle: object) -> None:  # Peers.close gives back each peer
        pass

    def remove_remote(self, name: str) -> None:
        pass


def descriptor(engine: str) -> LayoutDescriptor:
    return LayoutDescriptor(engine, "c", 16, 64, (1 << 20,), (GroupDesc("full_attention", 0, 1, 2),),
                            (), 0, 0, b"meta", 1 << 19, 4, "a:w:d", num_blocks=8)  # fmt: skip


def source(engine: str, port: int) -> RemoteSource:
    return RemoteSource(engine, "127.0.0.1", port, "r", ((1,),), (0,), None, 16, Lease(0, 1))


def test_dripping_producers_do_not_hold_an_honest_handshake() -> None:
    """Two listeners dripping a byte every 0.2 s take two of the handshake workers; an honest
    producer's handshake completes meanwhile, and the dripping ones fail at their deadline."""

    def drip(conn: socket.socket) -> None:
        for byte in _HELLO.pack(MAGIC, VERSION) + b"n" * NONCE_BYTES:
            conn.sendall(bytes([byte]))
            time.sleep(0.2)

    local = descriptor("d")
    port = free_port()
    server = SideChannelServer("127.0.0.1", port, descriptor("p").encode(), TEST_KEY)
    agent = NamedAgent()
    peers = Peers(agent, local, 2.0, StatsCounter(NixlStats), TEST_KEY)  # type: ignore[arg-type]
    try:
        with listener(drip) as a, listener(drip) as b:
            slow = [source("s1", a), source("s2", b)]
            for src in slow:
                assert peers.get(src) is None
            honest = source("p", port)
            peer = wait_for(lambda: peers.get(honest), what="the honest handshake")
            assert agent.added == [b"meta"]
            # done while the dripping ones still wait (not queued behind their deadline)
            assert [peers.get(src) for src in slow] == [None, None]
            for src in slow:
                wait_for(partial(failed, peers, src), what=f"{src.engine_id} to fail")
            assert peers.get(honest) is peer  # kept: others' failures forget nothing
    finally:
        peers.close()
        server.close()


def failed(peers: Peers, src: RemoteSource) -> bool:
    """Whether ``src``'s handshake has failed (``get`` raises), without waiting."""
    try:
        peers.get(src)
    except HandshakeFailed:
        return True
    return False
