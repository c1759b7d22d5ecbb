"""The offline API: ``LLM(model=...).generate(prompts, SamplingParams(...))``."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, NoReturn

from hybridkv.chat_boundaries import message_boundaries, with_cache_boundaries
from hybridkv.config import EngineConfig
from hybridkv.engine.core import EngineCore
from hybridkv.engine.frontend import FrontendOptions, attach, check_logprobs, engine_dtype
from hybridkv.engine.lifetime import EngineClosedError
from hybridkv.engine.output import RequestOutput, error_output
from hybridkv.engine.progress import Progress
from hybridkv.sampling.params import SamplingParams
from hybridkv.vllm_options import check_foreign, kv_cache_memory_from_env, split_vllm_options

if TYPE_CHECKING:
    from hybridkv.engine.beam_search import BeamSearchOutput, BeamSearchParams
    from hybridkv.model.loading.tokenizer import Tokenizer

# a dict is the caller's (vLLM's shape: prompt / prompt_token_ids / cache_salt), checked per key
PromptInput = str | list[int] | dict[str, Any]
logger = logging.getLogger(__name__)


class LLM:
    """An engine for offline batches. ``model=None`` uses the embedded default checkpoint.

    Options use vLLM's names: ``dtype``, ``max_model_len``, ``max_num_seqs``,
    ``max_num_batched_tokens``, ``block_size``, ``enable_prefix_caching``, ``kv_cache_memory``
    (bytes or "4GiB"), ``seed``, ``tokenizer`` (another tokenizer directory),
    ``generation_config`` (``auto``: the model's sampling defaults; ``vllm``: none; or a
    directory), ``max_logprobs``... vLLM's options with no job on a CPU engine
    (``gpu_memory_utilization``, ``enforce_eager``, ``tensor_parallel_size=1``...) are
    accepted with one warning, or refused when a value would change what runs
    (``hybridkv.vllm_options``); unknown options are errors.

    Lifetime: ``close()`` (or ``with LLM(...) as llm:``) stops and joins the connector's
    threads, frees its buffers and registrations and the KV events' sockets, and lets the
    weights and the KV cache go; an engine dropped without it releases the same when it is
    garbage collected (``engine/lifetime.py``). After ``close()``, ``generate``, ``chat``,
    ``reset_prefix_cache`` and ``engine`` raise ``EngineClosedError``.
    """

    def __init__(
        self,
        model: str | None = None,
        *,
        keep_logits: bool = False,
        tokenizer: str | None = None,
        generation_config: str = "auto",
        max_logprobs: int = 20,
        **options: Any,  # EngineConfig's fields by vLLM's names, checked by EngineConfig.create
    ) -> None:
        options, foreign = split_vllm_options(options)  # vLLM's kwargs with no job here
        options = kv_cache_memory_from_env(options)  # vLLM CPU's $VLLM_CPU_KVCACHE_SPACE
        warning = check_foreign(foreign, as_flags=False)  # a refused value raises
        if warning:
            logger.warning(warning)
        if "dtype" in options:
            options["dtype"] = engine_dtype(options["dtype"])
        frontend = FrontendOptions(tokenizer, None, generation_config, max_logprobs)
        config = EngineConfig.create(str(model or ""), **options)  # bad options fail here
        if model is None:
            from hybridkv.engine.default_model import ensure_default_model

            config = dataclasses.replace(config, model=str(ensure_default_model()))
        self.config = config
        self._engine: EngineCore | None = EngineCore(self.config, keep_logits=keep_logits)
        self.frontend = attach(self.engine, frontend)
        self.tokenizer = self.engine.tokenizer

    @property
    def engine(self) -> EngineCore:
        if self._engine is None:
            raise EngineClosedError(
                "this LLM was closed (LLM.close(), or the end of its 'with' block): create a "
                "new LLM to generate"
            )
        return self._engine

    def close(self) -> None:
        """Release everything the engine holds (see the class docstring); idempotent."""
        engine, self._engine = self._engine, None
        if engine is not None:
            engine.shutdown()

    def __enter__(self) -> LLM:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def get_tokenizer(self) -> Tokenizer:
        """The tokenizer (``encode``, ``decode``, ``__call__``, ``apply_chat_template``,
        ``eos_token_id``), as vLLM's ``LLM.get_tokenizer()``."""
        return self.engine.tokenizer

    def get_default_sampling_params(self) -> SamplingParams:
        """SamplingParams with the model's generation_config.json defaults (vLLM's)."""
        return SamplingParams(**self.frontend.defaults)

    def generate(
        self,
        prompts: PromptInput | Sequence[PromptInput],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        *,
        use_tqdm: bool = True,
    ) -> list[RequestOutput]:
        """Run every prompt to completion as one batch; outputs in prompt order.

        A prompt is a string, token ids, or a dict with ``prompt`` or ``prompt_token_ids`` and
        optionally ``cache_salt`` (vLLM's: prefix-cache entries are only shared between
        requests with the same salt). A prompt that cannot run (too long, bad token ids)
        gets an output with ``finish_reason == "error"`` and ``error`` saying why; the others
        run normally."""
        engine = self.engine  # EngineClosedError after close()
        items = _as_list(prompts)
        if sampling_params is None:
            sampling_params = self.get_default_sampling_params()
        params = _params_for(items, sampling_params)
        results: dict[int, RequestOutput] = {}
        order: dict[str, int] = {}
        for i, (item, p) in enumerate(zip(items, params, strict=True)):
            text: str | None = None
            ids: list[int] = []
            try:  # a malformed prompt fails alone, like one that is too long
                text, ids = self._tokenize(item)
                salt = _cache_salt(item)
                check_logprobs(p, self.frontend.options.max_logprobs)
                request_id = engine.new_request_id()
                engine.add_request(ids, p, request_id, prompt=text, cache_salt=salt)
                order[request_id] = i
            except (ValueError, TypeError) as exc:
                results[i] = error_output(f"rejected-{i}", text, ids, str(exc))
        self._run(order, results, use_tqdm)
        return [results[i] for i in range(len(items))]

    def chat(
        self,
        messages: list[dict[str, Any]] | list[list[dict[str, Any]]],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        *,
        use_tqdm: bool = True,
        chat_template: str | None = None,
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        tools: list[dict[str, Any]] | None = None,
        chat_template_kwargs: dict[str, Any] | None = None,
    ) -> list[RequestOutput]:
        """Apply the chat template to each conversation (content may be a list of text
        parts; ``chat_template_kwargs`` become template variables, e.g.
        ``{"enable_thinking": False}``), then generate. Each message's end in the rendered
        prompt is a state checkpoint boundary (``chat_boundaries``)."""
        self.engine  # noqa: B018 - EngineClosedError after close(), before the template
        single = bool(messages) and isinstance(messages[0], dict)
        conversations: list[Any] = [messages] if single else list(messages)
        template = {"tools": tools, "chat_template": chat_template, **(chat_template_kwargs or {})}
        prompts: list[PromptInput] = []
        bounds: list[list[int]] = []
        for conv in conversations:
            text = self.tokenizer.apply_chat_template(
                conv,
                add_generation_prompt=add_generation_prompt,
                continue_final_message=continue_final_message,
                **template,
            )
            # the template writes the special tokens (BOS...): none are added on top (vLLM's)
            ids = self.tokenizer.encode(text, add_special_tokens=False)
            prompts.append({"prompt": text, "prompt_token_ids": ids})
            bounds.append(message_boundaries(self.tokenizer, conv, ids, False, **template))
        params = [
            with_cache_boundaries(p, b)
            for p, b in zip(_params_for(prompts, sampling_params), bounds, strict=True)
        ]
        return self.generate(prompts, params, use_tqdm=use_tqdm)

    def beam_search(
        self, prompts: PromptInput | Sequence[PromptInput], params: BeamSearchParams, **_: Any
    ) -> list[BeamSearchOutput]:
        """vLLM's beam search: the ``params.beam_width`` best continuations of each prompt,
        best first (``engine/beam_search.py``; vLLM's ``use_tqdm`` and the like are
        accepted and ignored)."""
        from hybridkv.engine.beam_search import beam_search

        self.engine  # noqa: B018 - EngineClosedError after close()
        return beam_search(self, [self._tokenize(p)[1] for p in _as_list(prompts)], params)

    def embed(self, *args: Any, **kwargs: Any) -> NoReturn:
        raise NotImplementedError(_only_generation("embed"))

    def encode(self, *args: Any, **kwargs: Any) -> NoReturn:
        raise NotImplementedError(_only_generation("encode"))

    def score(self, *args: Any, **kwargs: Any) -> NoReturn:
        raise NotImplementedError(_only_generation("score"))

    def classify(self, *args: Any, **kwargs: Any) -> NoReturn:
        raise NotImplementedError(_only_generation("classify"))

    def reward(self, *args: Any, **kwargs: Any) -> NoReturn:
        raise NotImplementedError(_only_generation("reward"))

    def _tokenize(self, item: PromptInput) -> tuple[str | None, list[int]]:
        if isinstance(item, str):
            return item, self.tokenizer.encode(item)
        if isinstance(item, dict):
            if item.get("multi_modal_data"):
                raise ValueError(
                    "image inputs (multi_modal_data) are not supported: hybridkv runs the text "
                    "model of multimodal checkpoints"
                )
            if "prompt_token_ids" in item:
                return item.get("prompt"), [int(t) for t in item["prompt_token_ids"]]
            if "prompt" in item:
                return str(item["prompt"]), self.tokenizer.encode(str(item["prompt"]))
            raise ValueError(
                f"a prompt dict needs 'prompt' or 'prompt_token_ids', got keys {sorted(item)}"
            )
        return None, [int(t) for t in item]

    def reset_prefix_cache(self, tiers: bool = False) -> bool:
        """Forget every cached block (with ``tiers``, the connector's tier units too); False
        while requests are unfinished (nothing changes then). ``NoTiersError`` (a
        ``ValueError``) if ``tiers`` and the connector keeps none."""
        return self.engine.reset_prefix_cache(tiers).ok

    def _run(
        self, order: dict[str, int], results: dict[int, RequestOutput], use_tqdm: bool
    ) -> None:
        progress = Progress(len(order), use_tqdm)
        self.engine.outputs.final_only = True  # only finished outputs are read here
        try:
            while self.engine.has_unfinished_requests():
                for out in self.engine.step():
                    if out.finished and out.request_id in order:
                        results[order[out.request_id]] = out
                        progress.finished(out)
        finally:
            self.engine.outputs.final_only = False
            progress.close()


def _only_generation(method: str) -> str:
    return (
        f"LLM.{method} is not supported: hybridkv runs generative models (no pooling, "
        "embedding, scoring or classification); it offers LLM.generate, LLM.chat and "
        "LLM.beam_search"
    )


def _cache_salt(item: PromptInput) -> str | None:
    salt = item.get("cache_salt") if isinstance(item, dict) else None
    if salt is not None and (not isinstance(salt, str) or not salt):
        raise ValueError(f"cache_salt must be a non-empty string, got {salt!r}")
    return salt


def _as_list(prompts: PromptInput | Sequence[PromptInput]) -> list[PromptInput]:
    if isinstance(prompts, str | dict):
        return [prompts]
    items: list[Any] = list(prompts)
    if items and all(isinstance(t, int) for t in items):
        return [items]  # one prompt given as token ids
    return items


def _params_for(
    items: list[PromptInput], params: SamplingParams | Sequence[SamplingParams] | None
) -> list[SamplingParams]:
    if params is None:
        return [SamplingParams() for _ in items]
    if isinstance(params, SamplingParams):
        return [params for _ in items]
    params = list(params)
    if len(params) != len(items):
        raise ValueError(f"got {len(params)} SamplingParams for {len(items)} prompts")
    return params
