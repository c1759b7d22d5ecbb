"""The ``hybridkv serve`` subcommand's flags and entry (kept here so cli.py stays small and
importing it does not import the web stack)."""

from __future__ import annotations

import argparse
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hybridkv.secret_file import read_secret_file

if TYPE_CHECKING:
    from hybridkv.engine.frontend import FrontendOptions

LOG_LEVELS = ("critical", "error", "warning", "info", "debug", "trace")
API_KEY_ENV = "HYBRIDKV_API_KEY"


def add_serve_parser(
    subs: Any,
    add_frontend_flags: Callable[[argparse.ArgumentParser], None],
    add_engine_flags: Callable[[argparse.ArgumentParser], None],
) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = subs.add_parser(
        "serve", help="serve an OpenAI-compatible API with Prometheus metrics"
    )
    _add_serving_flags(p)
    _add_log_flags(p)
    _add_limit_flags(p)
    _add_tool_flags(p)
    add_frontend_flags(p)
    add_engine_flags(p)  # includes --kv-transfer-config
    return p


def _add_serving_flags(p: argparse.ArgumentParser) -> None:
    """What is served, where, and to whom."""
    p.add_argument(
        "model_tag",
        nargs="?",
        default=None,
        metavar="MODEL",
        help="checkpoint directory or org/name (as `vllm serve MODEL`; or --model)",
    )
    p.add_argument(
        "--model", default=None, help="checkpoint directory (default: the embedded tiny hybrid)"
    )
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, help="port to bind (default: 8000)")
    p.add_argument(
        "--api-key",
        default=None,
        help="require 'Authorization: Bearer KEY' on /v1/* routes (visible in ps: prefer "
        f"--api-key-file or the {API_KEY_ENV} environment variable)",
    )
    p.add_argument(
        "--api-key-file", type=Path, default=None, help="read the API key from this file"
    )
    p.add_argument(
        "--served-model-name",
        default=None,
        help="the model name clients send (default: --model, or the embedded model's name)",
    )


def _add_log_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--uvicorn-log-level",
        choices=LOG_LEVELS,
        default="info",
        help="uvicorn's log level (access log at info) (default: info)",
    )
    p.add_argument(
        "--log-level",
        choices=LOG_LEVELS[:-1],
        default="info",
        help="hybridkv's own log level: start-up summary, stats line, requests (default: info)",
    )
    p.add_argument(
        "--disable-log-requests",
        action="store_true",
        help="do not log each request as it arrives (logged by default)",
    )


def _add_limit_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("limits (what one client may cost)")
    g.add_argument(
        "--max-request-bytes",
        default="16MiB",
        help="largest request body; larger ones get 413 (default: 16MiB)",
    )
    g.add_argument(
        "--max-queued-requests",
        type=int,
        default=1024,
        help="requests that may wait for the engine; more get 503 + Retry-After (default: 1024)",
    )
    g.add_argument(
        "--engine-stall-seconds",
        type=float,
        default=30.0,
        help="/health answers 503 once one engine step has run this long (default: 30)",
    )
    g.add_argument(
        "--stream-stall-seconds",
        type=float,
        default=30.0,
        help="a client that reads none of its response for this long is disconnected and its "
        "request aborted (default: 30)",
    )


def _add_tool_flags(p: argparse.ArgumentParser) -> None:
    """vLLM's tool-calling and reasoning flags (docs/tool-calling.md)."""
    from hybridkv.server.reasoning.registry import reasoning_parser_names
    from hybridkv.server.tools.registry import tool_parser_names

    g = p.add_argument_group("tool calling and reasoning (as vLLM)")
    g.add_argument(
        "--enable-auto-tool-choice",
        action="store_true",
        help="let the model call tools on its own (tool_choice 'auto', and tools sent "
        "without tool_choice); needs --tool-call-parser",
    )
    g.add_argument(
        "--tool-call-parser",
        choices=tool_parser_names(),
        default=None,
        help="the model family's tool-call format, read into tool_calls",
    )
    g.add_argument(
        "--reasoning-parser",
        choices=reasoning_parser_names(),
        default=None,
        help="split the model's thinking into reasoning_content",
    )


def resolve_api_key(args: argparse.Namespace) -> str | None:
    """--api-key, else --api-key-file's content, else $HYBRIDKV_API_KEY, else none."""
    return resolve_secret(args.api_key, args.api_key_file, API_KEY_ENV, "--api-key")


def resolve_secret(value: str | None, path: Path | None, env: str, flag: str) -> str | None:
    """``flag``'s value, else the content of ``flag``-file, else ``$env``, else none; an
    empty key, or both the value and the file, is an error naming the flag."""
    if value is not None and path is not None:
        raise ValueError(f"give {flag} or {flag}-file, not both")
    if path is not None:
        key = read_secret_file(path, f"{flag}-file")
        try:
            return key.decode()
        except UnicodeDecodeError:
            raise ValueError(f"{flag}-file: {path} is not UTF-8 text") from None
    given = value if value is not None else os.environ.get(env)
    if given is not None and not given:
        raise ValueError(f"the key of {flag} (or ${env}) is empty")
    return given


def model_of(args: argparse.Namespace) -> str | None:
    """``serve MODEL`` or ``--model MODEL`` (both only if they agree)."""
    if args.model_tag and args.model and args.model_tag != args.model:
        raise ValueError(f"two models given: {args.model_tag!r} and --model {args.model!r}")
    return args.model_tag or args.model  # type: ignore[no-any-return]


def setup_logging(level: str) -> None:
    """hybridkv's loggers print ``LEVEL time [logger] message`` to stderr (vLLM's layout)."""
    handler = logging.StreamHandler()
    handler.setFormatter(
        logging.Formatter("%(levelname)s %(asctime)s [%(name)s] %(message)s", "%m-%d %H:%M:%S")
    )
    root = logging.getLogger("hybridkv")
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    root.propagate = False


def run_serve(
    args: argparse.Namespace, engine_options: dict[str, Any], frontend: FrontendOptions
) -> int:
    from hybridkv.paths import parse_bytes
    from hybridkv.server.chat_output import ChatParsers
    from hybridkv.server.launch import ServeOptions, run_server
    from hybridkv.server.limits import ServerLimits

    setup_logging(args.log_level)

    if not 1 <= args.port <= 65535:
        raise ValueError(f"--port {args.port} is not a port number (1..65535)")
    limits = ServerLimits(
        max_request_bytes=parse_bytes(args.max_request_bytes, "--max-request-bytes"),
        max_queued_requests=args.max_queued_requests,
        engine_stall_seconds=args.engine_stall_seconds,
        stream_stall_seconds=args.stream_stall_seconds,
    )
    return run_server(
        ServeOptions(
            model=model_of(args),
            host=args.host,
            port=args.port,
            api_key=resolve_api_key(args),
            limits=limits,
            served_model_name=args.served_model_name,
            log_level=args.uvicorn_log_level,
            engine_options=engine_options,
            frontend=frontend,
            log_requests=not args.disable_log_requests,
            chat_parsers=ChatParsers(
                args.tool_call_parser, args.enable_auto_tool_choice, args.reasoning_parser
            ),
        )
    )
