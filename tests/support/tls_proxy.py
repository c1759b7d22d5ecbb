"""A TLS front for a plain TCP server (the bundled ``valkey-server`` has no TLS build): it
accepts TLS on a free loopback port with a throw-away self-signed certificate (``openssl``)
and relays bytes both ways to the target port. Threads are daemons; ``close`` ends them."""

from __future__ import annotations

import contextlib
import socket
import ssl
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path


def make_certificate(directory: Path, name: str) -> tuple[Path, Path]:
    """(certificate, key) of a self-signed certificate for 127.0.0.1 / localhost; the
    certificate is its own CA."""
    cert, key = directory / f"{name}.pem", directory / f"{name}.key"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-keyout", str(key), "-out", str(cert), "-subj", f"/CN={name}",
         "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"],
        check=True, capture_output=True,
    )  # fmt: skip
    return cert, key


class TlsProxy:
    def __init__(self, target_port: int, cert: Path, key: Path) -> None:
        self.target_port = target_port
        self.context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.context.load_cert_chain(cert, key)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:  # closed
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            tls = self.context.wrap_socket(conn, server_side=True)
        except (OSError, ssl.SSLError):  # a client that refused our certificate
            conn.close()
            return
        upstream = socket.create_connection(("127.0.0.1", self.target_port))
        with self._lock:
            self._sockets += [tls, upstream]
        threading.Thread(target=_pump, args=(tls, upstream), daemon=True).start()
        _pump(upstream, tls)

    def close(self) -> None:
        self.listener.close()
        with self._lock:
            for sock in self._sockets:
                with contextlib.suppress(OSError):
                    sock.close()


def _pump(src: socket.socket, dst: socket.socket) -> None:
    try:
        while data := src.recv(1 << 16):
            dst.sendall(data)
    except OSError:
        pass
    with contextlib.suppress(OSError):
        dst.shutdown(socket.SHUT_WR)


@contextlib.contextmanager
def tls_front(target_port: int, cert: Path, key: Path) -> Iterator[TlsProxy]:
    proxy = TlsProxy(target_port, cert, key)
    try:
        yield proxy
    finally:
        proxy.close()
