"""Engines that misbehave, for the proxy's tests: a tiny HTTP/1.1 server on its own thread and
event loop, whose answer to each POST a test scripts (hang, die mid-stream, ...). ``GET
/health`` answers 200, or hangs when ``hung_health``."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Awaitable, Callable

from tests.support.ports import free_port

Answer = Callable[[bytes, asyncio.StreamWriter], Awaitable[None]]  # (request body, writer)
SSE_HEAD = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
)


class RawBackend:
    def __init__(self, answer: Answer, hung_health: bool = False) -> None:
        self.answer = answer
        self.hung_health = hung_health
        # set: the next request on a kept-alive connection that answered before closes it,
        # unanswered (what a server closing it, its keep-alive run out, as the client
        # reuses it looks like); cleared then
        self.close_on_reuse = threading.Event()
        self.num_closed_idle = 0
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.num_posts = 0
        self.num_health_probes = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._server: asyncio.Server | None = None

    def __enter__(self) -> RawBackend:
        self._thread.start()
        start = asyncio.start_server(self._handle, "127.0.0.1", self.port)
        self._server = asyncio.run_coroutine_threadsafe(start, self._loop).result(10)
        return self

    def __exit__(self, *exc: object) -> None:
        async def stop() -> None:
            assert self._server is not None
            self._server.close()
            for task in asyncio.all_tasks() - {asyncio.current_task()}:
                task.cancel()

        asyncio.run_coroutine_threadsafe(stop(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
            answered_at = None
            while True:  # keep-alive: one request after another
                head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1")
                if answered_at is not None and self.close_on_reuse.is_set():
                    self.close_on_reuse.clear()
                    self.num_closed_idle += 1
                    break
                method = head.split(" ", 1)[0]
                body = await reader.readexactly(_content_length(head))
                if method == "GET":
                    self.num_health_probes += head.split(" ", 2)[1] == "/health"
                    if self.hung_health:
                        await asyncio.sleep(3600)
                    writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")
                    await writer.drain()
                    continue
                self.num_posts += 1
                await self.answer(body, writer)
                if writer.is_closing():
                    return
                answered_at = time.monotonic()
        writer.close()


def _content_length(head: str) -> int:
    for line in head.split("\r\n"):
        name, _, value = line.partition(":")
        if name.strip().lower() == "content-length":
            return int(value)
    return 0


def chunk(data: bytes) -> bytes:
    """One HTTP/1.1 chunk."""
    return b"%x\r\n%s\r\n" % (len(data), data)


async def hang(body: bytes, writer: asyncio.StreamWriter) -> None:
    await asyncio.sleep(3600)


async def first_chunk_then_hang(body: bytes, writer: asyncio.StreamWriter) -> None:
    """A stream's first chunk naming the KV event batch 5 (its prefill's), then quiet."""
    writer.write(SSE_HEAD)
    writer.write(chunk(b'data: {"choices": [{"index": 0, "text": "a"}], "kv_events_seq": 5}\n\n'))
    await writer.drain()
    await asyncio.sleep(3600)


async def forged_first_chunk(body: bytes, writer: asyncio.StreamWriter) -> None:
    """A whole stream whose first chunk names a KV event batch its engine never published."""
    writer.write(SSE_HEAD)
    event = b'data: {"choices": [{"index": 0, "text": "a"}], "kv_events_seq": 1000000}\n\n'
    writer.write(chunk(event))
    await writer.drain()
    await asyncio.sleep(0.2)  # the proxy reads the first chunk apart
    writer.write(chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n")
    await writer.drain()


def dies_after_events(num_events: int, then_hang: bool = False) -> Answer:
    """A stream of ``num_events`` events, then the process dies (the connection is reset)
    or, with ``then_hang``, goes quiet."""

    async def answer(body: bytes, writer: asyncio.StreamWriter) -> None:
        writer.write(SSE_HEAD)
        for i in range(num_events):
            event = b'data: {"choices": [{"index": 0, "text": "%d"}]}\n\n' % i
            writer.write(chunk(event))
        writer.write(chunk(b'data: {"choices": [{"ind'))  # half an event
        await writer.drain()
        if then_hang:
            await asyncio.sleep(3600)
        writer.transport.abort()

    return answer


async def dies_mid_body(body: bytes, writer: asyncio.StreamWriter) -> None:
    """A JSON answer cut after its first bytes."""
    writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 500\r\n")
    writer.write(b'\r\n{"id": "cmpl-1", "choices": [')
    await writer.drain()
    writer.transport.abort()


async def dies_before_events(body: bytes, writer: asyncio.StreamWriter) -> None:
    """A stream's headers, then the process dies before its first token."""
    writer.write(SSE_HEAD)
    await writer.drain()
    await asyncio.sleep(0.2)
    writer.transport.abort()


async def cut_without_length(body: bytes, writer: asyncio.StreamWriter) -> None:
    """A JSON answer with neither a length nor chunks (it ends where the connection closes),
    closed half-way: only the body itself shows that it is cut."""
    writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nconnection: close\r\n")
    writer.write(b'\r\n{"id": "cmpl-1", "choices": [')
    await writer.drain()
    writer.close()


async def nested_too_deep(body: bytes, writer: asyncio.StreamWriter) -> None:
    """A whole answer, but JSON nested deeper than a parser recurses."""
    answer = b"[" * 100_000 + b"]" * 100_000
    writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n")
    writer.write(b"content-length: %d\r\n\r\n%s" % (len(answer), answer))
    await writer.drain()
