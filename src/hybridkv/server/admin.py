"""``POST /reset_prefix_cache[?tiers=true]``: forget the prefix cache (vLLM's route).

200 ``{"reset": true, "tier_units_dropped": n}`` once done; 409 (``cache_busy``) while requests
are unfinished -- nothing changes then (``engine/cache_reset.py`` says why); 400 for
``tiers=true`` when the connector keeps no tiers, or a ``tiers`` value that is not a boolean.
Guarded by the API key when the server has one (``app.BearerAuth``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fastapi import Request
from fastapi.responses import JSONResponse

from hybridkv.connectors.tier_events import NoTiersError
from hybridkv.engine.cache_reset import ResetResult
from hybridkv.server.async_engine import EngineDead
from hybridkv.server.errors import APIError, bad_request
from hybridkv.server.state import ServerState
from hybridkv.server.streaming import engine_error

if TYPE_CHECKING:
    from hybridkv.engine.core import EngineCore

RESET_PATH = "/reset_prefix_cache"
_BOOLS = {"true": True, "1": True, "false": False, "0": False}


async def reset_prefix_cache(request: Request) -> JSONResponse:
    raw = request.query_params.get("tiers", "false").lower()
    if raw not in _BOOLS:
        raise bad_request(f"tiers={raw!r} must be true or false", "tiers")
    tiers = _BOOLS[raw]

    def reset(engine: EngineCore) -> ResetResult:
        return engine.reset_prefix_cache(tiers)

    try:
        result: ResetResult = await ServerState.of(request).engine.call(reset)
    except NoTiersError as exc:
        raise bad_request(str(exc), "tiers") from None
    except EngineDead as exc:
        raise engine_error(exc) from None
    if not result.ok:
        raise APIError(409, f"prefix cache not reset: {result.reason}", code="cache_busy")
    return JSONResponse({"reset": True, "tier_units_dropped": result.num_tier_units})
