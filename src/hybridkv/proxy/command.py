"""``hybridkv proxy --prefill URL [URL...] --decode URL [URL...] [--host] [--port]``."""

from __future__ import annotations

import argparse
from typing import Any


def add_proxy_parser(subs: Any) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = subs.add_parser(
        "proxy", help="route OpenAI requests over prefill and decode engines (P/D disaggregation)"
    )
    p.add_argument("--prefill", nargs="*", default=[], metavar="URL", help="prefill engines")
    p.add_argument("--decode", nargs="+", required=True, metavar="URL", help="decode engines")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, help="port to bind (default: 8000)")
    p.add_argument("--log-level", default="warning", help="uvicorn log level (default: warning)")
    return p


def run_proxy(args: argparse.Namespace) -> int:
    import uvicorn

    from hybridkv.proxy.app import create_proxy_app
    from hybridkv.proxy.router import Router

    if not 1 <= args.port <= 65535:
        raise ValueError(f"--port {args.port} is not a port number (1..65535)")
    for url in [*args.prefill, *args.decode]:
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"engine URL {url!r} must start with http:// or https://")
    app = create_proxy_app(Router(args.prefill, args.decode))
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level)
    return 0
