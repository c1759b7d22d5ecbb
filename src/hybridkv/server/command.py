"""The ``hybridkv serve`` subcommand's flags and entry (kept here so cli.py stays small and
importing it does not import the web stack)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

LOG_LEVELS = ("critical", "error", "warning", "info", "debug", "trace")


def add_serve_parser(
    subs: Any, add_engine_flags: Callable[[argparse.ArgumentParser], None]
) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = subs.add_parser(
        "serve", help="serve an OpenAI-compatible API with Prometheus metrics"
    )
    p.add_argument(
        "--model", default=None, help="checkpoint directory (default: the embedded tiny hybrid)"
    )
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, help="port to bind (default: 8000)")
    p.add_argument(
        "--api-key", default=None, help="require 'Authorization: Bearer KEY' on /v1/* routes"
    )
    p.add_argument(
        "--served-model-name",
        default=None,
        help="the model name clients send (default: --model, or the embedded model's name)",
    )
    p.add_argument("--uvicorn-log-level", choices=LOG_LEVELS, default="info")
    add_engine_flags(p)  # includes --kv-transfer-config
    return p


def run_serve(args: argparse.Namespace, engine_options: dict[str, Any]) -> int:
    from hybridkv.server.launch import ServeOptions, run_server

    if not 1 <= args.port <= 65535:
        raise ValueError(f"--port {args.port} is not a port number (1..65535)")
    return run_server(
        ServeOptions(
            model=args.model,
            host=args.host,
            port=args.port,
            api_key=args.api_key,
            served_model_name=args.served_model_name,
            log_level=args.uvicorn_log_level,
            engine_options=engine_options,
        )
    )
