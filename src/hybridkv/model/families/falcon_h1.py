"""Falcon-H1: attention and Mamba2 side by side in every decoder layer, MuP multipliers
(``models/falcon_h1.py``)."""

from __future__ import annotations

from typing import Any

from hybridkv.model.config.layer_kinds import LayerKind
from hybridkv.model.families.family import ModelFamily
from hybridkv.model.families.parts import attention_part, mamba_part, size


def make_config(tiny: bool) -> dict[str, Any]:
    return {
        "architectures": ["FalconH1ForCausalLM"],
        "model_type": "falcon_h1",
        **attention_part(tiny),
        **mamba_part(tiny),
        "mamba_d_ssm": size(tiny, 1536, 128),
        "intermediate_size": size(tiny, 2048, 128),
        "num_hidden_layers": size(tiny, 8, 3),
        "embedding_multiplier": 2.0,
        "lm_head_multiplier": 0.5,
        "key_multiplier": 0.8,
        "ssm_multipliers": [1.0, 0.9, 1.1, 0.9, 1.0],
        "mlp_multipliers": [1.1, 0.9],
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
    }


FAMILY = ModelFamily(
    name="falcon_h1",
    module="hybridkv.model.models.falcon_h1",
    architectures={"FalconH1ForCausalLM": "FalconH1ForCausalLM"},
    model_types=("falcon_h1",),
    layer_kinds=frozenset({LayerKind.FULL, LayerKind.MAMBA}),
    make_config=make_config,
)
