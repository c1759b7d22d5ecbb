"""``GET /kv_events``: where this engine publishes its KV events and how it hashes blocks
(``kv_events/info.py``), for a KV-aware router (``hybridkv proxy``) to find and read them."""

from __future__ import annotations

from fastapi import Request
from fastapi.responses import JSONResponse

from hybridkv.kv_events.info import INFO_PATH, describe_engine
from hybridkv.server.state import ServerState

__all__ = ["INFO_PATH", "kv_events_info"]


async def kv_events_info(request: Request) -> JSONResponse:
    core = ServerState.of(request).engine.engine
    cache = core.config.cache
    info = describe_engine(
        core.config.kv_events_config,
        core.layout,
        cache.prefix_caching_hash_algo,
        cache.enable_prefix_caching,
    )
    return JSONResponse(info)
