"""Hugging Face architecture name -> model class, imported lazily on first use."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from hybridkv.model.config.errors import ModelLoadError

if TYPE_CHECKING:
    from hybridkv.model.models.common import CausalLM

_ARCHITECTURES: dict[str, tuple[str, str]] = {
    "Qwen3ForCausalLM": ("hybridkv.model.models.qwen3", "Qwen3ForCausalLM"),
    "Gemma3ForCausalLM": ("hybridkv.model.models.gemma3", "Gemma3ForCausalLM"),
    "Gemma3ForConditionalGeneration": (
        "hybridkv.model.models.gemma3",
        "Gemma3ForConditionalGeneration",
    ),
    "BambaForCausalLM": ("hybridkv.model.models.bamba", "BambaForCausalLM"),
    "NemotronHForCausalLM": ("hybridkv.model.models.nemotron_h", "NemotronHForCausalLM"),
    "FalconH1ForCausalLM": ("hybridkv.model.models.falcon_h1", "FalconH1ForCausalLM"),
    "Qwen3NextForCausalLM": ("hybridkv.model.models.qwen3_next", "Qwen3NextForCausalLM"),
    "Qwen3_5ForCausalLM": ("hybridkv.model.models.qwen3_next", "Qwen3_5ForCausalLM"),
    "Qwen3_5ForConditionalGeneration": (
        "hybridkv.model.models.qwen3_next",
        "Qwen3_5ForConditionalGeneration",
    ),
    "Qwen3_5MoeForCausalLM": ("hybridkv.model.models.qwen3_next", "Qwen3_5ForCausalLM"),
    "GptOssForCausalLM": ("hybridkv.model.models.gpt_oss", "GptOssForCausalLM"),
    "GraniteMoeHybridForCausalLM": (
        "hybridkv.model.models.granitemoehybrid",
        "GraniteMoeHybridForCausalLM",
    ),
}


def supported_architectures() -> tuple[str, ...]:
    return tuple(sorted(_ARCHITECTURES))


def check_architecture(architectures: object) -> str:
    """The first supported name in config.json's ``architectures`` list."""
    if not isinstance(architectures, list) or not architectures:
        raise ModelLoadError(
            "config.json has no 'architectures' list; supported: "
            + ", ".join(supported_architectures())
        )
    for name in architectures:
        if name in _ARCHITECTURES:
            return str(name)
    raise ModelLoadError(
        f"unsupported architecture {architectures!r}; supported: "
        + ", ".join(supported_architectures())
    )


def get_model_class(architecture: str) -> type[CausalLM]:
    module_name, class_name = _ARCHITECTURES[check_architecture([architecture])]
    return getattr(importlib.import_module(module_name), class_name)  # type: ignore[no-any-return]
