"""``KVRouting``: the proxy's view of where every decode engine's KV and state are, and the
routing decision it makes from it.

Start-up (background tasks of the proxy's lifespan), per decode engine::

    GET /kv_events (retried until it answers)  ->  EngineInfo: block size, hash, groups, endpoint
    SUB to the endpoint (--events URL wins)    ->  EngineIndex, kept by its EventSubscriber
    GET /metrics every --health-interval       ->  measured prefill seconds per token

Per request (``decide``): the prompt's token ids (``prompt.py``), its block hashes per distinct
(block size, hash) of the engines, each engine's predicted hit (``scoring.py``), the order
(``decision.py``). An engine that turns unhealthy loses its index (it may come back
restarted, empty): it is scored cold until its events say otherwise.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from typing import Any
from urllib.parse import urlsplit

import httpx

from hybridkv.kv.hashing import BlockHash
from hybridkv.proxy.routing.costs import refresh_cost
from hybridkv.proxy.routing.decision import Decision, Policy, Reason, order_engines
from hybridkv.proxy.routing.engine_info import parse_engine_info, reachable_endpoint
from hybridkv.proxy.routing.engines import EngineState, block_hashes
from hybridkv.proxy.routing.index import EngineIndex
from hybridkv.proxy.routing.options import RoutingOptions
from hybridkv.proxy.routing.prompt import read_prompt
from hybridkv.proxy.routing.settle import SettleStats, await_prefill, forget_answers, settle
from hybridkv.proxy.routing.subscriber import EventSubscriber

log = logging.getLogger(__name__)
INFO_RETRY_SECONDS = 1.0  # doubled after each failure, up to MAX_INFO_RETRY_SECONDS
MAX_INFO_RETRY_SECONDS = 30.0
MAX_INFO_BYTES = 1 << 20
RECENT_PREDICTIONS = 512  # answered decisions kept for GET /v1/routing/predictions


class KVRouting:
    def __init__(self, decode_urls: list[str], options: RoutingOptions) -> None:
        self.options = options
        self.engines = {
            u: EngineState(u, EngineIndex(options.index_max_blocks)) for u in decode_urls
        }
        for url, events in zip(decode_urls, options.events, strict=False):
            if events not in ("", "auto"):  # a wildcard host: the engine URL's host
                host = urlsplit(url).hostname or "127.0.0.1"
                self.engines[url].events_url = reachable_endpoint(events, host)
        self.decisions: dict[Reason, int] = dict.fromkeys(Reason, 0)
        self.settle_stats = SettleStats()
        self.num_decisions = 0
        self.recent: deque[dict[str, object]] = deque(maxlen=RECENT_PREDICTIONS)

    # -- background ---------------------------------------------------------------------

    async def run(self, client: httpx.AsyncClient, headers: dict[str, str]) -> None:
        """Find and follow every engine's events; refresh costs (until cancelled)."""
        tasks = [asyncio.create_task(self._follow(e, client, headers)) for e in self._all()]
        try:
            while True:
                await asyncio.sleep(self.options.cost_interval_seconds)
                for engine in self._all():
                    if engine.indexed:
                        await refresh_cost(engine, client, headers)
        finally:
            for t in tasks:
                t.cancel()
            for t in tasks:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await t

    async def _follow(
        self, engine: EngineState, client: httpx.AsyncClient, headers: dict[str, str]
    ) -> None:
        wait = INFO_RETRY_SECONDS
        while engine.info is None:
            try:
                answer = await client.get(engine.url + "/kv_events", headers=headers)
                if len(answer.content) > MAX_INFO_BYTES:
                    raise ValueError("kv_events info: answer too large")
                engine.info = parse_engine_info(answer.json(), engine.url)
            except (httpx.HTTPError, ValueError) as exc:
                log.debug("engine %s: no KV events info yet (%s)", engine.url, exc)
                await asyncio.sleep(wait)
                wait = min(2 * wait, MAX_INFO_RETRY_SECONDS)
        info = engine.info
        endpoint = engine.events_url or info.endpoint
        if endpoint is None:
            log.warning("engine %s publishes no KV events: routed by load", engine.url)
            return
        subscriber = EventSubscriber(engine.index, endpoint, info.topic, info.replay_endpoint)
        engine.subscriber = subscriber
        log.warning(
            "engine %s: KV events from %s (replay: %s), block size %d, %s, groups %s",
            engine.url,
            endpoint,
            info.replay_endpoint or "none",
            info.block_size,
            info.hash_algo.value,
            ",".join(g.kind for g in info.groups),
        )
        await subscriber.run()

    def on_health(self, url: str, healthy: bool) -> None:
        """An engine found down may come back restarted: forget what it held."""
        engine = self.engines.get(url)
        if engine is not None and not healthy:
            engine.index.clear()
            forget_answers(engine)

    # -- per request ----------------------------------------------------------------------

    async def decide(
        self,
        client: httpx.AsyncClient,
        path: str,
        body: dict[str, Any],
        headers: dict[str, str],
        turn: list[str],
        healthy: dict[str, bool],
        record: bool = True,
    ) -> Decision:
        """The decode engines in the order to try them, with their predicted hits (counted
        in ``decisions`` when ``record``)."""
        policy = self.options.policy
        prompt = None
        if any(e.indexed for e in self._all()):
            tokenizer = next((u for u in turn if healthy.get(u, True)), turn[0])
            timeout = self.options.tokenize_timeout_seconds
            prompt = await read_prompt(client, tokenizer, path, body, headers, timeout)
        self.num_decisions += 1
        decision = Decision(
            turn,
            Reason.NO_PROMPT,
            engines=self.engines,
            settle=self.settle_stats,
            number=self.num_decisions,
        )
        if prompt is not None:
            decision.num_prompt_tokens = n = len(prompt.token_ids)
            wait = self.options.settle_max_seconds
            decision.settled = await settle(self._all(), n, wait, self.settle_stats)
            self._predict(decision, prompt.token_ids, prompt.cache_salt)
        n, expected = decision.num_prompt_tokens, decision.expected
        decision.queued = {e.url: e.queued_tokens for e in self._all()}
        decision.order = order_engines(policy, turn, healthy, self.engines, expected, n)
        if record and prompt is not None:
            await self._await_prefill(decision, prompt.token_ids, prompt.cache_salt)
        best = expected.get(decision.order[0], 0)
        decision.reason = self._reason(policy, prompt is not None, best)
        if record:
            self.decisions[decision.reason] += 1
            decision.log = self.recent
            decision.reserve()
        return decision

    def can_skip_prefill(self, decision: Decision) -> bool:
        """P/D: the chosen decode engine holds (almost) the whole prompt."""
        n = decision.num_prompt_tokens
        skip = n > 0 and decision.uncached(decision.chosen) <= self.options.prefill_skip_tokens
        if skip:
            self.decisions[Reason.PREFILL_SKIPPED] += 1
        return skip

    def _predict(self, decision: Decision, token_ids: tuple[int, ...], salt: str | None) -> None:
        """Each indexed engine's hashes, predicted hit and expected hit, into ``decision``."""
        by_kind: dict[tuple[int, str], list[BlockHash]] = {}
        n = len(token_ids)
        peers = [e.index for e in self._all() if e.indexed]  # for shared tiers
        for engine in self._all():
            info = engine.info
            if info is None or not engine.indexed:
                continue
            key = (info.block_size, info.hash_algo.value)
            if key not in by_kind:
                by_kind[key] = block_hashes(info, token_ids, salt)
            hashes = by_kind[key]
            url = engine.url
            # the full blocks its prefill leaves cached (the last too, when the prompt ends
            # on a block boundary): what a later request here may hit once it landed
            decision.hashes[url] = hashes[: n // info.block_size]
            decision.predicted[url] = engine.predict(token_ids, hashes, peers)
            decision.expected[url] = max(
                decision.predicted[url], engine.pending_hit_tokens(hashes, n)
            )

    async def _await_prefill(
        self, decision: Decision, token_ids: tuple[int, ...], salt: str | None
    ) -> None:
        """The chosen engine is expected to hold more than its index says (a request sent
        there computes this prefix): predict the hit it will find once that landed -- at
        once where that is exact (attention-only, ``--prefill-wait auto``: the engine holds
        the request until then), else after waiting for it to land."""
        url = decision.chosen
        engine = self.engines.get(url)
        if engine is None or engine.info is None:
            return
        if decision.expected.get(url, 0) <= decision.predicted.get(url, 0):
            return
        hashes = block_hashes(engine.info, token_ids, salt)
        peers = [e.index for e in self._all() if e.indexed]
        decision.source = engine.pending_source(hashes, decision.predicted.get(url, 0))
        if self.options.prefill_wait == "auto" and engine.attention_only:
            self.settle_stats.num_prefill_dispatched += 1
            decision.prefill_wait = "dispatched"
            decision.predicted[url] = engine.landed_hit_tokens(token_ids, hashes, peers)
            return
        start = time.monotonic()
        limit = self.options.prefill_wait_max_seconds
        landed = await await_prefill(engine, hashes, len(token_ids), self.settle_stats, limit)
        decision.prefill_wait = "landed" if landed else "timeout"
        decision.prefill_wait_seconds = time.monotonic() - start
        decision.predicted[url] = engine.predict(token_ids, hashes, peers)

    @staticmethod
    def _reason(policy: Policy, have_prompt: bool, best_hit: int) -> Reason:
        if policy is Policy.ROUND_ROBIN:
            return Reason.ROUND_ROBIN
        if not have_prompt:
            return Reason.NO_PROMPT
        return Reason.CACHE_HIT if best_hit > 0 else Reason.LOAD

    def _all(self) -> list[EngineState]:
        return list(self.engines.values())
