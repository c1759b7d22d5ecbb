"""The model runner: one ``SchedulerOutput`` in, one ``RunnerOutput`` out.

Step order (the contract of ``hybridkv.step_io.SchedulerOutput``): drop finished
requests' sampler state; restore state checkpoints into live slots; zero the live slots of
requests with ``reset_state``; forward pass (which writes the saves due inside a prefill,
``StateCopy.at``, straight from the scan); save the other state checkpoints; sample.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from hybridkv.kv.spec import KVCacheLayout
from hybridkv.model.compiled.program import LazyDecodeProgram
from hybridkv.model.config.model_config import ModelConfig
from hybridkv.model.models.common import CausalLM
from hybridkv.model.sampling.prompt_logprobs import prompt_logprobs
from hybridkv.model.sampling.sampler import Sampler, SampleRequest
from hybridkv.model.step.cache_tensors import CacheTensors
from hybridkv.model.step.decode_reuse import DecodeInputs
from hybridkv.model.step.threads import StepThreads
from hybridkv.step_io import RunnerOutput, ScheduledRequest, SchedulerOutput, StateCopy

if TYPE_CHECKING:
    from hybridkv.sampling.grammar import GrammarBackend


class ModelRunner:
    def __init__(
        self,
        model: CausalLM,
        model_config: ModelConfig,
        layout: KVCacheLayout,
        num_blocks: int,
        num_state_slots: int,
        *,
        keep_logits: bool = False,
        seed: int = 0,
        grammar: GrammarBackend | None = None,
    ) -> None:
        if layout.num_layers != model_config.num_hidden_layers:
            raise ValueError(
                f"layout has {layout.num_layers} layers, model has {model_config.num_hidden_layers}"
            )
        self.model = model
        self.model_config = model_config
        self.layout = layout
        self.keep_logits = keep_logits
        self.cache = CacheTensors(layout, num_blocks, num_state_slots)
        self.sampler = Sampler(seed, eos_token_ids=model_config.eos_token_ids, grammar=grammar)
        self.threads = StepThreads.from_env()  # compute threads per step (model/step/threads.py)
        self.step_inputs = DecodeInputs()  # a steady decode batch reuses its input tensors
        # decode-only steps of few rows in one native call (model/compiled/program.py)
        self.decode_program = LazyDecodeProgram(
            model, layout, self.cache.kv_pages, self.cache.states
        )

    @torch.inference_mode()
    def execute(self, out: SchedulerOutput) -> RunnerOutput:
        return self._execute(out)[0]

    @torch.inference_mode()
    def execute_with_all_logits(
        self, out: SchedulerOutput
    ) -> tuple[RunnerOutput, dict[str, torch.Tensor]]:
        """Like ``execute``, plus float32 logits ``[n, vocab]`` of every scheduled token of
        every request (for tests and debugging; costs a full lm_head pass)."""
        return self._execute(out, all_logits=True)

    def _execute(
        self, out: SchedulerOutput, all_logits: bool = False
    ) -> tuple[RunnerOutput, dict[str, torch.Tensor]]:
        self.sampler.drop(out.finished_request_ids)
        self._copy_states(out.state_restores)
        self._reset_states(out.requests)
        result = RunnerOutput()
        every: dict[str, torch.Tensor] = {}
        if out.requests:
            logits, every = self._forward(out.requests, out.state_saves, all_logits, result)
            self._copy_states([c for c in out.state_saves if c.at is None])
            if logits is not None:  # else the program's greedy head gave the tokens
                self._sample(out.requests, logits, result)
        else:
            self._copy_states(out.state_saves)
        return result, every

    def _forward(
        self,
        requests: list[ScheduledRequest],
        saves: list[StateCopy],
        all_logits: bool,
        result: RunnerOutput,
    ) -> tuple[torch.Tensor | None, dict[str, torch.Tensor]]:
        """The sampling rows' logits ``[S, vocab]``, or None when the decode program's greedy
        head put every request's token in ``result``."""
        step = self.step_inputs.build(
            requests, self.layout, self.cache.kv_pages, self.cache.states, saves
        )
        self.threads.use()
        greedy = not all_logits and self._plain_greedy(requests)
        ran = self.decode_program.try_forward(step.input_ids, step.ctx, greedy)
        if ran is not None and ran.tokens is not None:
            for req, token in zip(requests, ran.tokens, strict=True):
                result.sampled_token_ids[req.request_id] = token
            return None, {}
        # [T, hidden]
        hidden = self.model(step.input_ids, step.ctx) if ran is None else ran.hidden
        logits = self.model.compute_logits(hidden[step.sample_token_idx])  # [S, vocab]
        if any(r.sampling_params.prompt_logprobs is not None for r in requests):
            result.prompt_logprobs.update(prompt_logprobs(self.model, hidden, requests))
        every: dict[str, torch.Tensor] = {}
        if all_logits:
            full = self.model.compute_logits(hidden)  # [T, vocab]
            for req, rows in zip(
                requests, torch.split(full, [len(r.token_ids) for r in requests]), strict=True
            ):
                every[req.request_id] = rows
        return logits, every

    def _plain_greedy(self, requests: list[ScheduledRequest]) -> bool:
        """Every request samples greedily with nothing else asked of its logits (the
        sampler's greedy fast path): the program's head may pick the tokens."""
        if self.keep_logits:
            return False
        for r in requests:
            p = r.sampling_params
            if not r.sample or p.temperature != 0.0 or p.logprobs is not None:
                return False
            if p.needs_processing or p.prompt_logprobs is not None:
                return False
        return True

    def _copy_states(self, copies: list[StateCopy]) -> None:
        for copy in copies:
            self.cache.copy_slot(copy.group_id, copy.src_slot, copy.dst_slot)

    def _reset_states(self, requests: list[ScheduledRequest]) -> None:
        to_reset = [r for r in requests if r.reset_state]
        for index, group_id in enumerate(self.layout.state_group_ids):
            self.cache.zero_slots(group_id, [r.state_slots[index] for r in to_reset])

    def _sample(
        self, requests: list[ScheduledRequest], logits: torch.Tensor, result: RunnerOutput
    ) -> None:
        sampling = [r for r in requests if r.sample]
        if not sampling:
            return
        reqs = [
            SampleRequest(r.request_id, r.sampling_params, r.num_output_tokens,
                          r.all_token_ids, r.num_prompt_tokens)
            for r in sampling
        ]  # fmt: skip
        sampled = self.sampler.sample(logits, reqs)
        for i, message in sampled.errors.items():
            result.errors[sampling[i].request_id] = message
            result.client_errors.add(sampling[i].request_id)
        for i in sampled.invalid_rows:
            result.errors[sampling[i].request_id] = (
                "the model produced non-finite logits (NaN or infinity) for this request: "
                "no token can be sampled (a corrupt KV cache entry or numerically broken weights)"
            )
        for i, req in enumerate(sampling):
            if req.request_id in result.errors:
                continue
            result.sampled_token_ids[req.request_id] = sampled.token_ids[i]
            logprob = sampled.logprobs[i]
            if logprob is not None:
                result.logprobs[req.request_id] = logprob
            if self.keep_logits:
                result.logits[req.request_id] = logits[i].tolist()
