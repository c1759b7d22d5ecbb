"""Which engines answer: each engine's ``/health`` probed with a short timeout, every
``health_interval_seconds`` in the background and again on a ``GET /health`` of the proxy
(at most one round per ``FRESH_SECONDS``, however many clients ask: no amplification).

A probe tells *down* from *slow*:

| probe                                               | result      | engine    |
|-----------------------------------------------------|-------------|-----------|
| 200                                                 | `ok`        | healthy   |
| non-200 (engine thread dead, a step past `--engine-stall-seconds`) | `unhealthy` | down |
| connection refused or not made in time              | `refused`   | down      |
| no answer within ``health_seconds`` (or dropped),   | `slow`      | healthy   |
| but the engine sent answer bytes within ``idle_seconds`` |        |           |
| no answer, and no answer bytes either (a hung process) | `timeout` | down      |

A down engine is routed around (and its calls in flight tried elsewhere) until a probe
succeeds. Probes use a pool without kept-alive connections (``app.py``): an engine closes an
idle one after its keep-alive, and a probe sent as it does would fail without an answer.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable

import httpx

from hybridkv.proxy.options import EngineTimeouts
from hybridkv.proxy.router import Router

log = logging.getLogger(__name__)
FRESH_SECONDS = 1.0
PROBE_RESULTS = ("ok", "slow", "unhealthy", "refused", "timeout")
ALIVE = ("ok", "slow")


class HealthMonitor:
    def __init__(self, router: Router, client: httpx.AsyncClient, timeouts: EngineTimeouts):
        self.router = router
        self.client = client
        self.timeouts = timeouts
        self._lock = asyncio.Lock()
        self._probed_at = -math.inf  # when the last round ended (monotonic)
        self.on_change: Callable[[str, bool], None] | None = None  # (url, healthy)
        self.probes: dict[tuple[str, str], int] = {}  # (engine, result) -> probes

    async def probe_all(self) -> None:
        """Probe every engine at once, unless a round ended within ``FRESH_SECONDS`` (one in
        progress is waited for); the router's ``healthy`` is updated in place."""
        async with self._lock:
            if time.monotonic() - self._probed_at >= FRESH_SECONDS:
                await self._probe_round()
                self._probed_at = time.monotonic()

    async def _probe_round(self) -> None:
        urls = list(self.router.healthy)
        results = await asyncio.gather(*(self._probe(u) for u in urls))
        for url, result in zip(urls, results, strict=True):
            key = (url, result)
            self.probes[key] = self.probes.get(key, 0) + 1
            ok = result in ALIVE
            if self.router.healthy[url] != ok:
                log.warning("engine %s is %s", url, "healthy again" if ok else "unhealthy")
                if self.on_change is not None:
                    self.on_change(url, ok)
            self.router.healthy[url] = ok

    async def run(self) -> None:
        """Probe forever (a background task of the app's lifespan)."""
        while True:
            await self.probe_all()
            await asyncio.sleep(self.timeouts.health_interval_seconds)

    def problem(self) -> str | None:
        """Why the proxy cannot serve disaggregated (or at all), or None if it can."""
        for role, urls in (("prefill", self.router.prefill), ("decode", self.router.decode)):
            if urls and not self.router.has_healthy(role):
                return f"no {role} engine is healthy (none of {len(urls)} answers /health)"
        return None

    async def _probe(self, url: str) -> str:
        """One of ``PROBE_RESULTS`` (the module's table)."""
        try:
            probe = self.client.get(url + "/health")
            response = await asyncio.wait_for(probe, self.timeouts.health_seconds)
        except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
            log.warning("engine %s: /health refused: %r", url, exc)
            return "refused"
        except (httpx.HTTPError, TimeoutError) as exc:
            if self.router.answered_within(url, self.timeouts.idle_seconds):
                log.info("engine %s: /health not answered (%r), but it is answering", url, exc)
                return "slow"
            log.warning("engine %s: /health not answered: %r", url, exc)
            return "timeout"
        if response.status_code != 200:
            log.warning("engine %s: /health %d: %s", url, response.status_code, response.text[:200])
            return "unhealthy"
        return "ok"
