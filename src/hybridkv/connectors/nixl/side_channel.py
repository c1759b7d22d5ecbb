"""The handshake's side channel: a producer serves its layout descriptor over TCP, only to a
party that proves it holds the deployment key (``auth``), and proves it holds it too.

Protocol version 5 (one exchange per connection; ``Nc``/``Ns``: 32 random bytes each)::

    client -> server   MAGIC, version (u16), Nc
    server -> client   MAGIC, version (u16), Ns, mac("server", Nc, Ns)
    client -> server   mac("client", Nc, Ns)            (the server checks it, else closes)
    server -> client   length (u32), descriptor, mac("descriptor", Nc, Ns, descriptor)

Both MACs bind both nonces, so neither side's answer can be replayed; the descriptor's MAC
binds it to this exchange (no one on the path can swap in other agent metadata). A client of
another version gets the server's version back and a clear error. Bounds: the whole exchange
has one deadline (``timeout``: a listener dripping bytes cannot stretch it), a descriptor
larger than ``MAX_DESCRIPTOR_BYTES`` is refused before anything is allocated, and a server
serves at most ``MAX_CONNECTIONS`` clients at once (others are closed at once), each under the
same deadline. Only producers and ``kv_both`` engines listen.
"""

from __future__ import annotations

import logging
import secrets
import socket
import struct
import threading
import time

from hybridkv.connectors.nixl.auth import AuthKey
from hybridkv.connectors.nixl.layout import PROTOCOL_VERSION

log = logging.getLogger(__name__)

MAGIC = b"HKVN"
VERSION = PROTOCOL_VERSION  # 5: the authenticated exchange above (4: lease heartbeats)
NONCE_BYTES = 32
MAC_BYTES = 32
MAX_DESCRIPTOR_BYTES = 4 << 20
MAX_CONNECTIONS = 8
_HELLO = struct.Struct(">4sH")


class SideChannelRefused(ValueError):
    """The other side speaks another protocol or does not hold the deployment key."""


class SideChannelServer:
    def __init__(
        self, host: str, port: int, payload: bytes, key: AuthKey, timeout: float = 5.0
    ) -> None:
        self._payload = payload
        self._key = key
        self._timeout = timeout
        self._slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        self._sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self._sock.bind((host, port))
        except OSError as exc:
            self._sock.close()
            raise ValueError(
                f"NixlConnector: cannot open the side channel on {host}:{port} ({exc}); two "
                f"engines on one host need distinct side_channel_port values"
            ) from None
        self._sock.listen(16)
        self._sock.settimeout(0.2)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="nixl-side-channel", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            if not self._slots.acquire(blocking=False):
                conn.close()  # MAX_CONNECTIONS clients at once: no one can hold the rest
                continue
            threading.Thread(target=self._answer, args=(conn,), daemon=True,
                             name="nixl-side-channel-client").start()  # fmt: skip

    def _answer(self, conn: socket.socket) -> None:
        deadline = time.monotonic() + self._timeout
        try:
            with conn:
                self._exchange(conn, deadline)
        except (OSError, SideChannelRefused) as exc:
            log.warning("NIXL side channel: a client was refused or went away: %s", exc)
        finally:
            self._slots.release()

    def _exchange(self, conn: socket.socket, deadline: float) -> None:
        magic, version = _HELLO.unpack(read_exact(conn, _HELLO.size, deadline))
        nonce_c = read_exact(conn, NONCE_BYTES, deadline)
        nonce_s = secrets.token_bytes(NONCE_BYTES)
        proof = self._key.mac(b"server", nonce_c, nonce_s)
        conn.sendall(_HELLO.pack(MAGIC, VERSION) + nonce_s + proof)
        if magic != MAGIC or version != VERSION:
            raise SideChannelRefused(f"a client of protocol version {version} (this one: {VERSION})")  # fmt: skip
        if not self._key.check(read_exact(conn, MAC_BYTES, deadline), b"client", nonce_c, nonce_s):
            raise SideChannelRefused("a client without the deployment key (no descriptor sent)")
        seal = self._key.mac(b"descriptor", nonce_c, nonce_s, self._payload)
        conn.sendall(struct.pack(">I", len(self._payload)) + self._payload + seal)

    def close(self) -> None:
        self._stop.set()
        self._sock.close()
        self._thread.join(2.0)


def fetch(host: str, port: int, timeout: float, key: AuthKey) -> bytes:
    """The producer's descriptor, within ``timeout`` seconds in all. Raises OSError (refused,
    timeout, short read) or SideChannelRefused (another version, no key, too large)."""
    deadline = time.monotonic() + timeout
    with socket.create_connection((host, port), timeout=timeout) as sock:
        nonce_c = secrets.token_bytes(NONCE_BYTES)
        sock.sendall(_HELLO.pack(MAGIC, VERSION) + nonce_c)
        magic, version = _HELLO.unpack(read_exact(sock, _HELLO.size, deadline))
        if magic != MAGIC:
            raise SideChannelRefused(
                f"it does not speak NixlConnector protocol version {VERSION} (engines before "
                "version 5 send their descriptor without authentication); run the same hybridkv "
                "version on the prefill and decode engines"
            )
        if version != VERSION:
            raise SideChannelRefused(
                f"the remote engine speaks NixlConnector protocol version {version}, this engine "
                f"{VERSION} (version 5 authenticates the handshake); run the same hybridkv "
                "version on the prefill and decode engines"
            )
        nonce_s = read_exact(sock, NONCE_BYTES, deadline)
        if not key.check(read_exact(sock, MAC_BYTES, deadline), b"server", nonce_c, nonce_s):
            raise SideChannelRefused(f"it does not hold this deployment's key ({key.source})")
        sock.sendall(key.mac(b"client", nonce_c, nonce_s))
        return _descriptor(sock, deadline, key, nonce_c, nonce_s)


def _descriptor(
    sock: socket.socket, deadline: float, key: AuthKey, nonce_c: bytes, nonce_s: bytes
) -> bytes:
    (size,) = struct.unpack(">I", read_exact(sock, 4, deadline))
    if size > MAX_DESCRIPTOR_BYTES:
        raise SideChannelRefused(
            f"it announced a descriptor of {size} bytes (at most {MAX_DESCRIPTOR_BYTES})"
        )
    payload = read_exact(sock, size, deadline)
    if not key.check(read_exact(sock, MAC_BYTES, deadline), b"descriptor", nonce_c, nonce_s, payload):  # fmt: skip
        raise SideChannelRefused("its descriptor's MAC does not match (altered on the way?)")
    return payload


def read_exact(sock: socket.socket, n: int, deadline: float) -> bytes:
    """``n`` bytes before ``deadline`` (monotonic); raises TimeoutError or ConnectionError."""
    chunks, got = [], 0
    while got < n:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"side channel: {got} of {n} bytes before the deadline")
        sock.settimeout(left)
        chunk = sock.recv(min(1 << 20, n - got))
        if not chunk:
            raise ConnectionError(f"side channel closed after {got} of {n} bytes")
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)
