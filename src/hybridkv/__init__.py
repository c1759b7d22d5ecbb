"""hybridkv: an LLM inference engine for hybrid models, built around its KV cache."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from hybridkv.sampling.logprobs import Logprob
from hybridkv.sampling.params import SamplingParams, StructuredOutputsParams

if TYPE_CHECKING:
    from hybridkv.engine.beam_search import BeamSearchParams
    from hybridkv.engine.llm import LLM

__all__ = ["LLM", "BeamSearchParams", "Logprob", "SamplingParams", "StructuredOutputsParams"]
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    if name == "LLM":  # lazy: importing the package must not load torch
        from hybridkv.engine.llm import LLM

        return LLM
    if name == "BeamSearchParams":
        from hybridkv.engine.beam_search import BeamSearchParams

        return BeamSearchParams
    raise AttributeError(name)
