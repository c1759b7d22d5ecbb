"""Model side of hybridkv: config, loading, tokenizer, architectures, runner, sampler."""

from hybridkv.model.config import LayerKind, MambaConfig, ModelConfig, load_model_config
from hybridkv.model.errors import ModelLoadError
from hybridkv.model.loader import load_model
from hybridkv.model.registry import supported_architectures
from hybridkv.model.runner import ModelRunner
from hybridkv.model.tokenizer import Tokenizer

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
