"""Bamba: Mamba2 layers with attention at listed indices (``models/bamba.py``)."""

from __future__ import annotations

from typing import Any

from hybridkv.model.config.layer_kinds import LayerKind
from hybridkv.model.families.family import ModelFamily
from hybridkv.model.families.parts import attention_part, mamba_part, size


def make_config(tiny: bool) -> dict[str, Any]:
    layers = size(tiny, 12, 4)
    return {
        "architectures": ["BambaForCausalLM"],
        "model_type": "bamba",
        **attention_part(tiny),
        **mamba_part(tiny),
        "intermediate_size": size(tiny, 2048, 128),
        "num_hidden_layers": layers,
        "attn_layer_indices": [i for i in range(layers) if i % 4 == 3],
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
    }


FAMILY = ModelFamily(
    name="bamba",
    module="hybridkv.model.models.bamba",
    architectures={"BambaForCausalLM": "BambaForCausalLM"},
    model_types=("bamba",),
    layer_kinds=frozenset({LayerKind.FULL, LayerKind.MAMBA}),
    make_config=make_config,
)
