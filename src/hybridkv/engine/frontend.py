"""What ``LLM`` and ``hybridkv serve`` add on top of an ``EngineCore``, in one place: another
tokenizer (``--tokenizer``), a chat template (``--chat-template``), the model's sampling defaults
(``--generation-config``), the ``--max-logprobs`` limit, the start-up summary in the log, and
vLLM's dtype names."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from hybridkv.engine.generation_config import sampling_defaults
from hybridkv.engine.summary import startup_summary

if TYPE_CHECKING:
    from hybridkv.engine.core import EngineCore
    from hybridkv.sampling.params import SamplingParams

logger = logging.getLogger("hybridkv")

DEFAULT_MAX_LOGPROBS = 20  # vLLM's
HALF_DTYPES = ("half", "float16")
DTYPE_CHOICES = ("auto", "float32", "float", "bfloat16", *HALF_DTYPES)


@dataclass(frozen=True, slots=True)
class FrontendOptions:
    tokenizer: str | None = None  # a tokenizer directory (or org/name) other than the model's
    chat_template: str | None = None  # a file, or the template text
    generation_config: str = "auto"  # auto | vllm | a directory
    max_logprobs: int = DEFAULT_MAX_LOGPROBS

    def __post_init__(self) -> None:
        if not isinstance(self.max_logprobs, int) or self.max_logprobs < 0:
            raise ValueError(f"max_logprobs={self.max_logprobs!r} must be an integer >= 0")


@dataclass(frozen=True, slots=True)
class Frontend:
    options: FrontendOptions
    defaults: dict[str, Any] = field(default_factory=dict)  # generation_config.json's (JSON)


def engine_dtype(dtype: str) -> str:
    """vLLM's names to ours: ``float`` is float32; ``half``/``float16`` are refused (the CPU
    runs float16 matmuls far slower than bfloat16, which has the same memory cost)."""
    if dtype in HALF_DTYPES:
        raise ValueError(
            f"dtype={dtype!r}: float16 is not supported on CPU (its matmuls are emulated and "
            "slow): use dtype bfloat16 (same memory) or float32"
        )
    return "float32" if dtype == "float" else dtype


def attach(engine: EngineCore, options: FrontendOptions) -> Frontend:
    """Apply the options to a fresh engine (before its first request) and log its summary."""
    if options.tokenizer is not None:
        from hybridkv.model.loading.hub import resolve_model_dir
        from hybridkv.model.loading.tokenizer import Tokenizer

        eos = engine.model_config.eos_token_ids
        tokenizer_dir = resolve_model_dir(options.tokenizer)
        engine.tokenizer = Tokenizer(tokenizer_dir, eos_token_ids=eos)
        engine.grammar.use_tokenizer(tokenizer_dir, engine.tokenizer.eos_token_ids)
    if options.chat_template is not None:
        engine.tokenizer.set_chat_template(options.chat_template)
    defaults = sampling_defaults(options.generation_config, engine.model_dir)
    for line in startup_summary(engine).splitlines():
        logger.info("%s", line)
    return Frontend(options, defaults)


def check_logprobs(params: SamplingParams, limit: int) -> None:
    """vLLM's engine rule: at most ``max_logprobs`` alternatives per token."""
    for name in ("logprobs", "prompt_logprobs"):
        k = getattr(params, name, None)
        if isinstance(k, int) and k > limit:
            raise ValueError(f"{name}={k} is more than max_logprobs={limit}")
