"""What one client may cost the server: body size, time to send a request, queue room.

::

    socket -- GuardedH11Protocol: headers within header_timeout_seconds, else closed;
              a response the client stops reading closed after stream_stall_seconds
           -- BodyLimit: body <= max_request_bytes (413), sent within body_timeout_seconds (408)
           -- routes: tokenize off the event loop; AsyncEngine.submit refuses a request while
              max_queued_requests wait (503 + Retry-After)

uvicorn (0.54, h11) bounds header size (``h11_max_incomplete_event_size``) and idle keep-alive
connections, but not how long a client may take to send its headers or its body: both are
bounded here, so half-sent requests cannot pile up. Nor does uvicorn bound how long a client
may leave its response unread: its flow control pauses the app once ~64 KiB wait in the
socket's buffer (so the buffer is bounded), but the request behind it would run on to its
``max_tokens``, holding its KV blocks and its growing cumulative output. A connection whose
writes stay paused for ``stream_stall_seconds`` is aborted (buffer dropped); the route sees the
disconnect and aborts its request.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send
from uvicorn.protocols.http.h11_impl import H11Protocol

from hybridkv.server.errors import APIError

MiB = 1 << 20


@dataclass(frozen=True, slots=True)
class ServerLimits:
    """Per-server limits (``hybridkv serve`` flags of the same names)."""

    max_request_bytes: int = 16 * MiB
    max_queued_requests: int = 1024
    engine_stall_seconds: float = 30.0
    stream_stall_seconds: float = 30.0
    header_timeout_seconds: float = 10.0
    body_timeout_seconds: float = 30.0
    keep_alive_seconds: int = 5
    max_header_bytes: int = 16 * 1024  # h11's own default, made explicit

    def __post_init__(self) -> None:
        _positive_int(self.max_request_bytes, "--max-request-bytes")
        _positive_int(self.max_queued_requests, "--max-queued-requests")
        _positive_int(self.keep_alive_seconds, "--keep-alive-seconds")
        _positive_int(self.max_header_bytes, "max_header_bytes")
        for name in (
            "engine_stall_seconds",
            "stream_stall_seconds",
            "header_timeout_seconds",
            "body_timeout_seconds",
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not math.isfinite(value) or value <= 0:
                raise ValueError(f"--{name.replace('_', '-')} must be a finite number > 0")

    def uvicorn_options(self, on_stalled: Callable[[], None] | None = None) -> dict[str, Any]:
        """``uvicorn.Config`` keywords enforcing these limits; ``on_stalled`` is called for
        each connection closed because its client stopped reading."""
        fields = {
            "header_timeout": self.header_timeout_seconds,
            "write_stall_timeout": self.stream_stall_seconds,
            "on_stalled": staticmethod(on_stalled or _nothing),
        }
        protocol = type("GuardedH11Protocol", (GuardedH11Protocol,), fields)
        return {
            "http": protocol,
            "timeout_keep_alive": self.keep_alive_seconds,
            "h11_max_incomplete_event_size": self.max_header_bytes,
        }


def _positive_int(value: object, name: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {value!r}")


def _nothing() -> None:
    pass


@dataclass(frozen=True, slots=True)
class PromptLimits:
    """How long a prompt may be: ``max_model_len`` tokens, so at most ``max_prompt_chars``
    characters (``max_model_len`` times the longest token's text; None: no early check)."""

    max_model_len: int
    max_prompt_chars: int | None = None
    max_logprobs: int = 20  # --max-logprobs: the largest logprobs / prompt_logprobs k


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol, closing a connection whose request headers do not arrive within
    ``header_timeout`` seconds of it opening (or of its previous response), and aborting one
    whose writes stay paused (the client reads nothing) for ``write_stall_timeout`` seconds."""

    # ServerLimits.uvicorn_options() subclasses with its own values
    header_timeout: float = 10.0
    write_stall_timeout: float = 30.0
    on_stalled: Callable[[], None] = staticmethod(_nothing)
    _stall_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm_header_timer()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._arm_header_timer()

    def _arm_header_timer(self) -> None:
        waiting_after = self.cycle  # a new request replaces the cycle
        self.loop.call_later(self.header_timeout, self._maybe_close, waiting_after)

    def _maybe_close(self, waiting_after: object) -> None:
        if self.cycle is waiting_after and not self.transport.is_closing():
            self.transport.close()

    def pause_writing(self) -> None:
        """The socket's buffer passed the high-water mark: the client has this long to read."""
        super().pause_writing()
        if self._stall_timer is None:
            self._stall_timer = self.loop.call_later(self.write_stall_timeout, self._abort_stalled)

    def resume_writing(self) -> None:
        super().resume_writing()
        if self._stall_timer is not None:
            self._stall_timer.cancel()
            self._stall_timer = None

    def connection_lost(self, exc: Exception | None) -> None:
        if self._stall_timer is not None:
            self._stall_timer.cancel()
            self._stall_timer = None
        super().connection_lost(exc)

    def _abort_stalled(self) -> None:
        """NOTE: ``abort``, not ``close``: close would wait for the unread buffer to drain."""
        self._stall_timer = None
        if self.flow.write_paused and not self.transport.is_closing():
            self.on_stalled()
            self.transport.abort()  # -> connection_lost: the route sees a disconnect


class BodyLimit:
    """Reads a request's body before the app does, refusing it with 413 once it is larger than
    ``max_bytes`` (a ``Content-Length`` that says so is refused before reading) and with 408
    when it takes longer than ``timeout`` seconds; the app then reads the body from memory."""

    def __init__(
        self,
        app: ASGIApp,
        max_bytes: int,
        timeout: float,
        on_refused: Callable[[str], None] = lambda reason: None,
    ) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.timeout = timeout
        self.on_refused = on_refused  # "too_large" or "body_timeout"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length", b"0")
        if declared.isdigit() and int(declared) > self.max_bytes:
            self.on_refused("too_large")
            await self._too_large().response()(scope, receive, send)
            return
        try:
            body = await asyncio.wait_for(self._read(receive), self.timeout)
        except TimeoutError:
            self.on_refused("body_timeout")
            late = APIError(408, f"the request body did not arrive within {self.timeout:g} s")
            await late.response()(scope, receive, send)
            return
        except APIError as error:
            self.on_refused("too_large")
            await error.response()(scope, receive, send)
            return
        if body is None:
            return  # the client went away
        await self.app(scope, _replay(body, receive), send)

    async def _read(self, receive: Receive) -> bytes | None:
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                raise self._too_large()
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)

    def _too_large(self) -> APIError:
        return APIError(
            413,
            f"the request body is larger than --max-request-bytes={self.max_bytes}",
            code="request_too_large",
        )


def _replay(body: bytes, receive: Receive) -> Receive:
    """The body once, then the connection's own messages (a disconnect, for watchers)."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay
