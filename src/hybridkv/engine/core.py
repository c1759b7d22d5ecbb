"""EngineCore: one step is schedule -> run -> update, plus the text-side postprocessing.

out = scheduler.schedule()          # plain data: tokens, block tables, state slots/copies
result = runner.execute(out)        # forward pass + sampling
updated = scheduler.update_from_output(out, result)
-> detokenize the new tokens (engine/detokenizer.py: stop strings too), RequestOutputs
"""

from __future__ import annotations

import itertools
import time
import weakref
from dataclasses import replace
from typing import TYPE_CHECKING

from hybridkv.config import EngineConfig
from hybridkv.connectors.base import KVConnectorPair
from hybridkv.connectors.registry import ConnectorContext, create_connector
from hybridkv.engine.cache_access import DeviceCacheAccess
from hybridkv.engine.cache_reset import ResetResult, reset_prefix_cache
from hybridkv.engine.lifetime import EngineClosedError, EngineResources, weak_method
from hybridkv.engine.output import RequestOutput, TextState
from hybridkv.engine.outputs import OutputProcessor
from hybridkv.engine.parallel import ParallelSampling, ParentRequest
from hybridkv.engine.request_prep import check_prompt_ids, prepare_params, truncate_prompt
from hybridkv.engine.sizing import resolve_dtype, size_cache
from hybridkv.engine.stats import EngineStats, StepCounters, TransferCounters, group_cache_stats
from hybridkv.engine.step import run_step
from hybridkv.engine.weights_id import model_identity
from hybridkv.kv.coordinator import KVCacheConfig, KVCacheCoordinator
from hybridkv.kv.hashing import BlockHasher, get_hash_fn
from hybridkv.kv.spec import create_layout
from hybridkv.request import Request, RequestStatus
from hybridkv.sampling.grammar import GrammarBackend
from hybridkv.sampling.params import SamplingParams, TransferFields
from hybridkv.sched.kv_transfer import KVTransfer
from hybridkv.sched.scheduler import Scheduler

if TYPE_CHECKING:
    from hybridkv.kv_events.collector import KVEventCollector


class EngineCore:
    def __init__(self, config: EngineConfig, *, keep_logits: bool = False) -> None:
        self.config = config
        self.keep_logits = keep_logits
        self._load_model()
        self._create_cache()
        # threads, buffers, sockets: released once, by shutdown() or when the engine is
        # collected (engine/lifetime.py), even if the rest of __init__ fails
        self._resources = EngineResources()
        self._release = weakref.finalize(self, self._resources.release)
        try:
            self.connector = self._create_connector()
            self.kv_events = self._create_kv_events() if self._events_on else None
        except BaseException:
            self._release()
            raise
        self.scheduler = Scheduler(
            config.scheduler, self.max_model_len, self.kv, self._create_transfer()
        )
        self._transfer_counters = TransferCounters()  # the connector's counts since start
        self._hash_fn = get_hash_fn(config.cache.prefix_caching_hash_algo)
        self.outputs = OutputProcessor(self.scheduler, keep_logits)
        self._ids = itertools.count()
        self._counters = StepCounters()  # tokens per step and in all, for stats()
        self._parallel = ParallelSampling(weak_method(self._add_child))  # no cycle to self
        self.outputs.wants_every = self._parallel.is_child  # a child's first output spawns
        self._prompts: dict[str, tuple[list[int], str | None, str | None]] = {}  # of n > 1

    def _load_model(self) -> None:
        """The checkpoint: its directory, dtype, model, config and tokenizer."""
        from hybridkv.model.loading.hub import resolve_model_dir
        from hybridkv.model.loading.loader import load_model, load_model_config
        from hybridkv.model.loading.tokenizer import Tokenizer

        config = self.config
        self.model_dir = resolve_model_dir(config.model)  # a directory, or org/name in the cache
        self.dtype = resolve_dtype(config.dtype, dict(load_model_config(self.model_dir).raw))
        self.model, self.model_config = load_model(self.model_dir, self.dtype, config.bf16_matmul)
        self.tokenizer = Tokenizer(self.model_dir, eos_token_ids=self.model_config.eos_token_ids)
        self.max_model_len = (
            config.scheduler.max_model_len or self.model_config.max_position_embeddings
        )

    @property
    def _events_on(self) -> bool:
        events = self.config.kv_events_config
        return events is not None and events.enabled

    def _create_cache(self) -> None:
        """The cache's layout and size, its block manager (``kv``) and the model runner that
        holds the tensors (and the grammar backend both the engine and the runner use)."""
        from hybridkv.model.step.runner import ModelRunner

        config, model_config = self.config, self.model_config
        specs = model_config.layer_specs(config.cache.block_size, self.dtype)
        self.layout = create_layout(specs, config.cache.block_size)
        self.sizing = size_cache(config, self.layout, self.max_model_len)
        self.grammar = GrammarBackend(
            self.model_dir, model_config.vocab_size, model_config.eos_token_ids
        )
        kv_config = KVCacheConfig(
            self.sizing.num_blocks,
            self.sizing.num_state_slots,
            config.cache.enable_prefix_caching,
            config.cache.state_checkpoint_interval,
            enable_kv_cache_events=self._events_on,  # only with a consumer: they would pile up
            key_events=self._events_on,
            max_checkpoints=self.sizing.max_checkpoints,
            states_from_scan=True,  # Mamba2 and Gated DeltaNet scans hand back mid-chunk states
        )
        self.kv = KVCacheCoordinator(self.layout, kv_config)
        self.runner = ModelRunner(
            self.model,
            model_config,
            self.layout,
            self.sizing.num_blocks,
            self.sizing.num_state_slots,
            keep_logits=self.keep_logits,
            seed=config.seed,  # unseeded requests sample from the runner's own generator
            grammar=self.grammar,
        )

    def _create_connector(self) -> KVConnectorPair | None:
        transfer_config = self.config.kv_transfer_config
        if transfer_config is None:
            return None
        model_id = model_identity(
            self.model_dir, self.model_config.architecture, self.dtype, self.config.bf16_matmul
        )
        context = ConnectorContext(
            layout=self.layout,
            fingerprint=self.layout.fingerprint(model_id),
            num_blocks=self.sizing.num_blocks,
            num_state_slots=self.sizing.num_state_slots,
            model_id=model_id,
            max_model_len=self.max_model_len,
        )
        pair = self._resources.connector = create_connector(transfer_config, context)
        cache = self.runner.cache
        access = DeviceCacheAccess(self.layout, cache.backing, cache.states)
        self._resources.cache = access
        pair.worker.register_kv_caches(access)
        return pair

    def _create_transfer(self) -> KVTransfer | None:
        transfer_config = self.config.kv_transfer_config
        if self.connector is None or transfer_config is None:
            return None
        policy = transfer_config.kv_load_failure_policy
        return KVTransfer(self.connector.scheduler, policy, self.kv)

    def _create_kv_events(self) -> KVEventCollector | None:
        from hybridkv.kv_events.collector import create_collector  # imports zmq

        connector = self.connector.scheduler if self.connector is not None else None
        collector = create_collector(self.config.kv_events_config, self.layout, connector)
        self._resources.kv_events = collector
        return collector

    def stats(self) -> EngineStats:
        """One snapshot of the engine's state and counters (call on the engine thread)."""
        sched, transfer = self.scheduler.stats(), self.scheduler.transfer
        cache = self.kv.stats
        groups = group_cache_stats(self.layout, cache.queried_tokens, cache.group_hit_tokens)
        return EngineStats(
            num_running=sched.num_running,
            num_waiting=sched.num_waiting,
            num_waiting_for_remote_kv=sched.num_waiting_for_remote_kv,
            kv_usage=float(sched.kv_usage),
            num_preemptions=sched.num_preemptions,
            prefix_cache_queries=cache.num_queries,
            prefix_cache_queried_tokens=cache.queried_tokens,
            prefix_cache_hit_tokens=cache.hit_tokens,
            groups=groups,
            transfer=self._transfer_counters.snapshot(transfer.stats if transfer else None),
            kv_events=self.kv_events.stats() if self.kv_events is not None else None,
            steps=self._counters.snapshot(),
            checkpoints=self.kv.checkpoint_stats(),
            inflight=replace(self.scheduler.inflight.stats),
        )

    @property
    def closed(self) -> bool:
        return not self._release.alive

    def shutdown(self) -> None:
        """Publish the last KV events, then release the connector and the events' sockets
        (``engine/lifetime.py``: threads stopped and joined, buffers and registrations
        freed). Idempotent; afterwards every request, step or reset raises
        ``EngineClosedError``. Call on the engine thread, between steps."""
        if self.closed:
            return
        if self.kv_events is not None:
            self.kv_events.publish_step(self.kv.take_events())
        self._release()

    def _check_open(self) -> None:
        if self.closed:
            raise EngineClosedError(
                "this engine was shut down (LLM.close(), or the end of its 'with' block): "
                "create a new one"
            )

    def reset_prefix_cache(self, tiers: bool = False) -> ResetResult:
        """Forget every cached block (and every tier unit with ``tiers``); refused unless
        idle (``engine/cache_reset.py``). ``NoTiersError`` if ``tiers`` and none exist."""
        self._check_open()
        return reset_prefix_cache(self.kv, self.scheduler, self.connector, self.kv_events, tiers)

    # -- requests ------------------------------------------------------------------------

    def new_request_id(self) -> str:
        return f"req-{next(self._ids)}"

    def add_request(
        self,
        prompt_token_ids: list[int],
        params: SamplingParams,
        request_id: str | None = None,
        prompt: str | None = None,
        cache_salt: str | None = None,
    ) -> Request:
        """Queue a request; raises ValueError naming the problem (nothing is queued then, and
        a producer holding KV for its ``kv_transfer_params`` is told to free it).
        With ``params.n > 1`` the request fans out (``engine/parallel.py``): outputs come
        under ``request_id`` with n completions; the first child's ``Request`` is returned."""
        self._check_open()
        try:
            return self._add_request(prompt_token_ids, params, request_id, prompt, cache_salt)
        except ValueError:
            self.release_transfer(params.transfer_fields)
            raise

    def release_transfer(self, params: TransferFields | None) -> None:
        """A request carrying ``params`` was refused before the scheduler held it: the
        connector lets a producer free what it keeps for it now (``request_dropped``)."""
        if params and self.scheduler.transfer is not None:
            self.scheduler.transfer.drop_refused(params)

    def _add_request(
        self,
        prompt_token_ids: list[int],
        params: SamplingParams,
        request_id: str | None,
        prompt: str | None,
        cache_salt: str | None,
    ) -> Request:
        request_id = request_id or self.new_request_id()
        prompt_token_ids = truncate_prompt(prompt_token_ids, params, self.max_model_len)
        params = prepare_params(params, self.tokenizer, self.model_config.vocab_size, self.grammar)
        if params.n > 1:
            parent = ParentRequest(request_id, params, prompt, prompt_token_ids)
            self._prompts[request_id] = (prompt_token_ids, prompt, cache_salt)
            request_id, params = self._parallel.add(parent)
        mc = self.model_config
        check_prompt_ids(
            request_id, prompt_token_ids, mc.vocab_size, mc.media_token_ids, mc.architecture
        )
        hasher = BlockHasher(self.layout.block_size, self._hash_fn, cache_salt)
        req = Request(request_id, prompt_token_ids, params, hasher, mc.eos_token_ids)
        self.scheduler.add_request(req)
        state = TextState.create(req, prompt, self.tokenizer)
        self.outputs.add(req, state)
        return req

    def _add_child(self, child_id: str, params: SamplingParams) -> None:
        parent_id = child_id.split("_", 1)[1]
        ids, prompt, salt = self._prompts[parent_id]
        self.add_request(ids, params, child_id, prompt, salt)

    def abort_request(self, request_id: str) -> None:
        children = self._parallel.abort(request_id)
        for child_id in children if children is not None else [request_id]:
            self.scheduler.finish_request(child_id, RequestStatus.FINISHED_ABORTED)

    def has_unfinished_requests(self) -> bool:
        """Requests to run, or connector work only steps advance (a message to send)."""
        worker = self.connector.worker if self.connector is not None else None
        return self.scheduler.has_unfinished_requests() or (
            worker is not None and worker.needs_steps()
        )

    # -- one step ------------------------------------------------------------------------

    def step(self) -> list[RequestOutput]:
        """Run one engine step; return an output for each request that got a token or finished."""
        self._check_open()
        started = time.monotonic()
        worker = self.connector.worker if self.connector else None
        out, result, updated = run_step(self.scheduler, self.runner, worker, self._publish_events)
        num_sampled, ended = len(result.sampled_token_ids), time.monotonic()
        self._counters.record(out, num_sampled, self.outputs.live, started, ended)
        if self.connector is not None:
            self._transfer_counters.record(self.connector.scheduler, self.connector.worker)
        self._publish_events()
        outputs = self.outputs.process(updated, result, time.monotonic())
        routed = self._parallel.route(outputs + self.outputs.take_finished_elsewhere())
        seq = self.kv_events.last_seq if self.kv_events is not None else None
        for output in routed:
            output.kv_events_seq = seq
            if output.finished:
                self._prompts.pop(output.request_id, None)
        return routed

    def _publish_events(self) -> None:
        """The prefix map's changes so far as one batch: called after scheduling (blocks it
        evicted: a router stops counting them before the forward runs) and after the step
        (blocks it stored), both before the step's outputs."""
        if self.kv_events is not None:
            self.kv_events.publish_step(self.kv.take_events())
