"""``hybridkv serve``: build the engine, serve the app with uvicorn, say how to call it."""

from __future__ import annotations

import asyncio
import json
import shlex
import socket
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

from hybridkv.engine.frontend import FrontendOptions, attach
from hybridkv.metrics.prometheus import ServerMetrics
from hybridkv.server.async_engine import AsyncEngine
from hybridkv.server.chat_output import ChatParsers
from hybridkv.server.limits import ServerLimits
from hybridkv.server.state import ServerState

EXAMPLE_PROMPT = "The key to a fast inference engine is"
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class ServeOptions:
    model: str | None = None  # None: the embedded default model
    host: str = "127.0.0.1"
    port: int = 8000
    api_key: str | None = None
    served_model_name: str | None = None
    log_level: str = "info"
    limits: ServerLimits = field(default_factory=ServerLimits)
    engine_options: dict[str, Any] = field(default_factory=dict)  # incl. kv_transfer_config
    frontend: FrontendOptions = field(default_factory=FrontendOptions)
    log_requests: bool = True
    chat_parsers: ChatParsers = field(default_factory=ChatParsers)  # tool calls, reasoning


def build_state(options: ServeOptions) -> ServerState:
    """Load the model and create the (not yet started) engine thread."""
    from hybridkv.config import EngineConfig
    from hybridkv.engine.core import EngineCore
    from hybridkv.engine.default_model import DEFAULT_NAME, ensure_default_model
    from hybridkv.engine.summary import cache_info

    config = EngineConfig.create(options.model or "", **options.engine_options)  # fails fast
    if not options.model:
        config = replace(config, model=str(_in_passing_thread(ensure_default_model)))
    engine = _in_passing_thread(EngineCore, config)
    frontend = attach(engine, options.frontend)
    model_name = options.served_model_name or options.model or DEFAULT_NAME
    metrics = ServerMetrics(model_name, cache_info(engine))
    return ServerState(
        engine=AsyncEngine(engine, metrics, options.limits.max_queued_requests),
        metrics=metrics,
        tokenizer=engine.tokenizer,
        model_name=model_name,
        max_model_len=engine.max_model_len,
        limits=options.limits,
        # x2: headroom for normalizers that shorten text (NFC composing "e" + U+0301)
        max_prompt_chars=2 * engine.max_model_len * engine.tokenizer.max_token_chars,
        sampling_defaults=frontend.defaults,
        max_logprobs=options.frontend.max_logprobs,
        log_requests=options.log_requests,
        chat_parsers=options.chat_parsers,
    )


def _in_passing_thread(fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` in a thread that ends with it (its exception raised here). Loading runs
    torch ops, and the OpenMP pool they create belongs to the thread that ran them: left on
    the main thread, its idle worker makes libgomp manage more threads than there are CPUs
    once the engine thread has its own pool, and libgomp then stops spinning between parallel
    regions, so every native kernel call of a decode step waits for a futex wake-up (a Q8_0
    projection 140 us instead of 61 us; one stream decoded at half ``LLM.generate``'s speed).
    A pool is freed with its thread."""
    with ThreadPoolExecutor(1, thread_name_prefix="hybridkv-load") as pool:
        return pool.submit(fn, *args).result()


def run_server(options: ServeOptions) -> int:
    import prometheus_client
    import uvicorn

    from hybridkv.server.app import create_app

    prometheus_client.disable_created_metrics()  # type: ignore[no-untyped-call]  # process-wide
    sock = bind_socket(options.host, options.port)  # fail fast, before loading the model
    state = build_state(options)
    app = create_app(state, options.api_key)
    config = uvicorn.Config(
        app,
        log_level=options.log_level,
        timeout_graceful_shutdown=5,
        **options.limits.uvicorn_options(on_stalled=state.metrics.on_stalled),
    )
    server = uvicorn.Server(config)
    banner = ready_message(options, state.model_name)
    asyncio.run(_serve_and_announce(server, sock, banner))
    return 0 if state.engine.error in (None, "the server is shutting down") else 1


def bind_socket(host: str, port: int) -> socket.socket:
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
        return socket.create_server((host, port), family=family, backlog=2048)
    except OSError as exc:
        raise ValueError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None


async def _serve_and_announce(server: Any, sock: socket.socket, banner: str) -> None:
    """Serve; print the banner once the socket accepts connections."""
    task = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started and not task.done():
        await asyncio.sleep(0.05)  # start-up only
    if server.started:
        print(banner, flush=True)
    await task


def ready_message(options: ServeOptions, model_name: str) -> str:
    host = "127.0.0.1" if options.host in ("0.0.0.0", "::", "") else options.host
    base = f"http://{host}:{options.port}"
    body = json.dumps({"model": model_name, "prompt": EXAMPLE_PROMPT, "max_tokens": 24})
    auth = " -H 'Authorization: Bearer <your --api-key>'" if options.api_key else ""
    return (
        f"hybridkv: serving {model_name!r} at {base} "
        f"(OpenAI API under /v1, Prometheus metrics at /metrics)\n"
        f"try:\n  curl {base}/v1/completions -H 'Content-Type: application/json'{auth} "
        f"-d {shlex.quote(body)}"
    )
