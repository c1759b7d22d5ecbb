"""The handshake's side channel: a producer serves its layout descriptor over TCP.

Protocol (one exchange per connection): the client connects, the server sends a 4-byte
big-endian length and the encoded ``LayoutDescriptor`` (JSON, agent metadata included), and
closes. Only producers and ``kv_both`` engines listen.
"""

from __future__ import annotations

import logging
import socket
import struct
import threading

log = logging.getLogger(__name__)


class SideChannelServer:
    def __init__(self, host: str, port: int, payload: bytes) -> None:
        self._payload = struct.pack(">I", len(payload)) + payload
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
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
            with conn:
                try:
                    conn.sendall(self._payload)
                except OSError as exc:
                    log.warning("NIXL side channel: a client went away: %s", exc)

    def close(self) -> None:
        self._stop.set()
        self._sock.close()
        self._thread.join(2.0)


def fetch(host: str, port: int, timeout: float) -> bytes:
    """The producer's descriptor; raises OSError (refused, timeout, short read)."""
    with socket.create_connection((host, port), timeout=timeout) as sock:
        sock.settimeout(timeout)
        header = _read(sock, 4)
        (size,) = struct.unpack(">I", header)
        return _read(sock, size)


def _read(sock: socket.socket, n: int) -> bytes:
    chunks, got = [], 0
    while got < n:
        chunk = sock.recv(min(1 << 20, n - got))
        if not chunk:
            raise ConnectionError(f"side channel closed after {got} of {n} bytes")
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)
