"""A model family as data: everything the loader, ``make-model``, the CLI and the tests need to
know of it besides its model file, importable without torch (``hybridkv --help`` reads it).

A family is one model file (``hybridkv/model/models/<x>.py``, the ``nn.Module`` classes) plus
one descriptor here (``families/<x>.py``: ``FAMILY = ModelFamily(...)``), listed once in
``registry.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from hybridkv.model.config.layer_kinds import LayerKind

# tiny? -> the family's part of a make-model config.json (tiny: tests; small: 50-150M
# parameters, benchmarks); make_model adds the common keys (vocab, eos, dtype...)
ConfigBuilder = Callable[[bool], dict[str, Any]]


@dataclass(frozen=True, slots=True)
class ModelFamily:
    name: str  # make-model's --arch, the tests' family id
    module: str  # the model file: "hybridkv.model.models.<x>"
    architectures: Mapping[str, str]  # config.json "architectures" name -> class in ``module``
    model_types: tuple[str, ...]  # config.json "model_type" values its checkpoints use
    layer_kinds: frozenset[LayerKind]  # the kinds its layers may have
    make_config: ConfigBuilder  # make-model's checkpoint named ``name``
    # further make-model checkpoints of the family: name -> builder (e.g. qwen3_full)
    variants: Mapping[str, ConfigBuilder] = field(default_factory=dict)
    # our parameter name suffix -> other spellings checkpoints use (the loader tries each)
    renames: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    # how make-model writes weights, as transformers' save_pretrained does for the family:
    offset_norms: bool = False  # (1 + w) norms, stored around 0 (not their DeltaNet out norm)
    saved_prefix: tuple[str, str] | None = None  # (our prefix, the prefix written instead)
    saved_split_experts: bool = False  # stacked experts written one tensor per expert

    def get_class_path(self, architecture: str) -> tuple[str, str]:
        """``(module, class name)`` of ``architecture`` (one of ``architectures``)."""
        return self.module, self.architectures[architecture]

    def get_make_configs(self) -> dict[str, ConfigBuilder]:
        """make-model name -> config builder: the family's own checkpoint, then its variants."""
        return {self.name: self.make_config, **self.variants}
