"""Model side of hybridkv: config, loading, tokenizer, architectures, runner, sampler."""

from hybridkv.model.config.errors import ModelLoadError
from hybridkv.model.config.model_config import (
    LayerKind,
    MambaConfig,
    ModelConfig,
    load_model_config,
)
from hybridkv.model.families.registry import supported_architectures
from hybridkv.model.loading.loader import load_model
from hybridkv.model.loading.tokenizer import Tokenizer
from hybridkv.model.step.runner import ModelRunner

__all__ = [
    "LayerKind",
    "MambaConfig",
    "ModelConfig",
    "ModelLoadError",
    "ModelRunner",
    "Tokenizer",
    "load_model",
    "load_model_config",
    "supported_architectures",
]
