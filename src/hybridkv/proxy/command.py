"""``hybridkv proxy --prefill URL [URL...] --decode URL [URL...] [--host] [--port] ...``."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

BACKEND_KEY_ENV = "HYBRIDKV_BACKEND_API_KEY"


def add_proxy_parser(subs: Any) -> argparse.ArgumentParser:
    from hybridkv.server.command import API_KEY_ENV

    p: argparse.ArgumentParser = subs.add_parser(
        "proxy", help="route OpenAI requests over prefill and decode engines (P/D disaggregation)"
    )
    p.add_argument("--prefill", nargs="*", default=[], metavar="URL", help="prefill engines")
    p.add_argument("--decode", nargs="+", required=True, metavar="URL", help="decode engines")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, help="port to bind (default: 8000)")
    p.add_argument("--log-level", default="warning", help="uvicorn log level (default: warning)")
    g = p.add_argument_group("keys")
    g.add_argument("--api-key", default=None, help="require 'Authorization: Bearer KEY' from "
                   f"clients on /v1/* (or --api-key-file, or ${API_KEY_ENV})")  # fmt: skip
    g.add_argument("--api-key-file", type=Path, default=None)
    g.add_argument("--backend-api-key", default=None, help="the key of engines started with "
                   "--api-key, sent to them as 'Authorization: Bearer KEY' (or "
                   f"--backend-api-key-file, or ${BACKEND_KEY_ENV}); without it the client's "
                   "Authorization header goes to the engines as it came")  # fmt: skip
    g.add_argument("--backend-api-key-file", type=Path, default=None)
    g.add_argument(
        "--allow-client-kv-transfer-params",
        action="store_true",
        help="pass a client's own kv_transfer_params to the decode engine (default: dropped; "
        "only for clients as trusted as the engines: the decode engine reads where they say)",
    )
    _add_limit_flags(p)
    _add_routing_flags(p)
    return p


def _add_routing_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("KV-aware routing (docs/routing.md)")
    g.add_argument("--routing", choices=["round_robin", "cache", "cost"], default="cost",
                   help="round_robin; cache: the longest predicted hit; cost (default): the "
                   "least queued + uncached prefill time")  # fmt: skip
    g.add_argument("--events", nargs="+", default=[], metavar="ENDPOINT",
                   help="each --decode engine's KV events endpoint, in order (tcp://host:port; "
                   "'auto': read from the engine's /kv_events, the default)")  # fmt: skip
    g.add_argument("--index-max-blocks", type=int, default=1_000_000,
                   help="block hashes kept per engine (least recent forgotten past it)")  # fmt: skip
    g.add_argument("--prefill-skip-tokens", type=int, default=64, help="P/D: no prefill "
                   "engine when the decode engine misses at most this many prompt tokens")  # fmt: skip
    g.add_argument("--settle-max-seconds", type=float, default=0.25, help="a decision waits "
                   "at most this long (<= 2) for an engine's events its answers say were "
                   "published (default: 0.25)")  # fmt: skip
    g.add_argument("--prefill-wait", choices=["auto", "landed"], default="auto",
                   help="a request whose prefix the chosen engine computes for another: "
                   "auto (default): sent at once, its landed hit predicted, on attention-only "
                   "engines, else waits until that prefill landed; landed: always waits")  # fmt: skip


def _add_limit_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("limits and timeouts")
    g.add_argument("--max-request-bytes", default="16MiB",
                   help="largest request body; larger ones get 413 (default: 16MiB)")  # fmt: skip
    g.add_argument("--stream-stall-seconds", type=float, default=30.0, help="a client that "
                   "reads none of its answer for this long is disconnected (default: 30)")  # fmt: skip
    timeouts = (
        ("--connect-timeout", 5.0, "connecting to an engine"),
        ("--first-byte-timeout", 300.0, "an engine's first answer byte (a whole prefill, or "
         "a whole non-streamed answer)"),
        ("--idle-timeout", 60.0, "between two chunks of an engine's answer"),
        ("--health-timeout", 2.0, "one /health probe of an engine"),
        ("--health-interval", 5.0, "between two rounds of /health probes"),
    )  # fmt: skip
    for flag, default, what in timeouts:
        g.add_argument(flag, type=float, default=default,
                       help=f"seconds: {what} (default: {default:g})")  # fmt: skip


def proxy_options(args: argparse.Namespace) -> Any:
    """The validated ``ProxyOptions`` of the parsed flags."""
    from hybridkv.paths import parse_bytes
    from hybridkv.proxy.options import EngineTimeouts, ProxyOptions
    from hybridkv.server.command import API_KEY_ENV, resolve_secret
    from hybridkv.server.limits import ServerLimits

    limits = ServerLimits(
        max_request_bytes=parse_bytes(args.max_request_bytes, "--max-request-bytes"),
        stream_stall_seconds=args.stream_stall_seconds,
    )
    timeouts = EngineTimeouts(
        connect_seconds=args.connect_timeout,
        first_byte_seconds=args.first_byte_timeout,
        idle_seconds=args.idle_timeout,
        health_seconds=args.health_timeout,
        health_interval_seconds=args.health_interval,
    )
    return ProxyOptions(
        limits=limits,
        timeouts=timeouts,
        api_key=resolve_secret(args.api_key, args.api_key_file, API_KEY_ENV, "--api-key"),
        backend_api_key=resolve_secret(
            args.backend_api_key, args.backend_api_key_file, BACKEND_KEY_ENV, "--backend-api-key"
        ),
        allow_client_kv_transfer_params=args.allow_client_kv_transfer_params,
        routing=routing_options(args),
    )


def routing_options(args: argparse.Namespace) -> Any:
    from hybridkv.proxy.routing.decision import Policy
    from hybridkv.proxy.routing.options import RoutingOptions

    if args.events and len(args.events) != len(args.decode):
        raise ValueError(
            f"--events names {len(args.events)} endpoints for {len(args.decode)} --decode "
            "engines: give one per engine, in order ('auto' to discover one)"
        )
    return RoutingOptions(
        policy=Policy(args.routing),
        events=tuple(args.events),
        index_max_blocks=args.index_max_blocks,
        prefill_skip_tokens=args.prefill_skip_tokens,
        settle_max_seconds=args.settle_max_seconds,
        cost_interval_seconds=args.health_interval,
        prefill_wait=args.prefill_wait,
        prefill_wait_max_seconds=args.first_byte_timeout,
    )


def run_proxy(args: argparse.Namespace) -> int:
    import uvicorn

    from hybridkv.proxy.app import create_proxy_app
    from hybridkv.proxy.router import Router

    if not 1 <= args.port <= 65535:
        raise ValueError(f"--port {args.port} is not a port number (1..65535)")
    for url in [*args.prefill, *args.decode]:
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"engine URL {url!r} must start with http:// or https://")
    options = proxy_options(args)
    app = create_proxy_app(Router(args.prefill, args.decode), options)
    uvicorn.run(
        app,
        host=args.host,
        port=args.port,
        log_level=args.log_level,
        **options.limits.uvicorn_options(),
    )
    return 0
