"""Reading one part's ``MGET`` reply straight off the socket, payload values into one array.

valkey-py's reply parser (``libvalkey``) copies every byte twice after the kernel does
(``recv_into`` a 64 KiB buffer, ``feed`` into its own buffer, then a ``bytes`` per value), and
a part cut into several values is joined once more before it is verified. A part's reply is
simple (RESP2: ``*N``, then ``$len`` + bytes or ``$-1`` per value), so this reader takes it
itself: the header value as ``bytes``, the payload values received by the kernel straight into
one array of the part's size (no copy in user space, no join). Anything unexpected is a
``valkey.ConnectionError`` / ``valkey.ResponseError`` (the protocol) or a ``PartError`` (a
value of the wrong size), and the caller drops the connection.
"""

from __future__ import annotations

import socket

import numpy as np
import valkey

from hybridkv.connectors.part_error import CORRUPT, PartError

_BUFFER = 1 << 16
_MAX_LINE = 1 << 10


class ReplyReader:
    """A byte stream over one connected socket: lines and exact-size reads."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buf = bytearray(_BUFFER)
        self.start = 0
        self.end = 0

    def _fill(self) -> None:
        if self.start:
            rest = self.end - self.start
            self.buf[:rest] = self.buf[self.start : self.end]
            self.start, self.end = 0, rest
        got = _recv(self.sock, memoryview(self.buf)[self.end :])
        self.end += got

    def line(self) -> bytes:
        while True:
            i = self.buf.find(b"\r\n", self.start, self.end)
            if i >= 0:
                line = bytes(self.buf[self.start : i])
                self.start = i + 2
                return line
            if self.end - self.start > _MAX_LINE:
                raise valkey.ConnectionError("remote reply: line too long")
            self._fill()

    def into(self, out: memoryview) -> None:
        """Fill ``out`` exactly: what is buffered first, then straight from the socket."""
        have = min(out.nbytes, self.end - self.start)
        out[:have] = self.buf[self.start : self.start + have]
        self.start += have
        while have < out.nbytes:
            have += _recv(self.sock, out[have:])

    def crlf(self) -> None:
        while self.end - self.start < 2:
            self._fill()
        if self.buf[self.start : self.start + 2] != b"\r\n":
            raise valkey.ConnectionError("remote reply: bad value end")
        self.start += 2


def read_part_reply(
    reader: ReplyReader, num_values: int, header_nbytes: int, payload_nbytes: int
) -> tuple[bytes, list[memoryview]] | None:
    """An ``MGET`` reply of a part's ``num_values`` values: its header value and payload
    (one array, filled in order whatever sizes the values have; the verification decides),
    or None if some value is missing (all of the reply is read then).

    Sizes are checked before anything is allocated or received: a header value that is not
    ``header_nbytes`` long, or payload values longer than ``payload_nbytes`` in all, is
    ``PartError(CORRUPT)`` at once, the rest of the reply unread (the caller drops the
    connection), so a value of any size announced by the server costs no memory."""
    head = reader.line()
    if head[:1] == b"-":
        raise valkey.ResponseError(head[1:].decode(errors="replace"))
    if head != b"*%d" % num_values:
        raise valkey.ConnectionError(f"remote reply: {head[:32]!r} for {num_values} values")
    payload = memoryview(np.empty(payload_nbytes, dtype=np.uint8).data).cast("B")
    header, filled, missing = b"", 0, False
    for i in range(num_values):
        size = _bulk_size(reader.line())
        if size < 0:
            missing = True
            continue
        if i == 0:
            if size != header_nbytes:
                raise PartError(CORRUPT, f"a header value of {size} bytes, not {header_nbytes}")
            value = memoryview(bytearray(size))
            reader.into(value)
            header = value.tobytes()
        elif filled + size <= payload_nbytes:
            reader.into(payload[filled : filled + size])
            filled += size
        else:
            raise PartError(CORRUPT, f"payload values beyond the part's {payload_nbytes} bytes")
        reader.crlf()
    if missing:
        return None
    return header, ([payload[:filled]] if filled else [])


def _bulk_size(line: bytes) -> int:
    if line[:1] == b"$":
        try:
            return int(line[1:])
        except ValueError:
            pass
    raise valkey.ConnectionError(f"remote reply: {line[:32]!r} is not a value")


def _recv(sock: socket.socket, into: memoryview) -> int:
    try:
        got = sock.recv_into(into)
    except TimeoutError:
        raise valkey.TimeoutError("Timeout reading from socket") from None
    except OSError as exc:
        raise valkey.ConnectionError(f"Error while reading from socket: {exc}") from None
    if not got:
        raise valkey.ConnectionError("Connection closed by server.")
    return got
