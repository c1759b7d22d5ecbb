"""gpt-oss: sliding and full attention alternating, attention sinks, YaRN, MoE
(``models/gpt_oss.py``)."""

from __future__ import annotations

from typing import Any

from hybridkv.model.config.layer_kinds import LayerKind
from hybridkv.model.families.family import ModelFamily
from hybridkv.model.families.parts import attention_part, size


def make_config(tiny: bool) -> dict[str, Any]:
    layers = size(tiny, 12, 4)
    return {
        "architectures": ["GptOssForCausalLM"],
        "model_type": "gpt_oss",
        **attention_part(tiny),
        "num_hidden_layers": layers,
        "intermediate_size": size(tiny, 512, 64),
        "num_local_experts": size(tiny, 8, 4),
        "num_experts_per_tok": 2,
        "sliding_window": size(tiny, 128, 32),
        "layer_types": [
            "sliding_attention" if i % 2 == 0 else "full_attention" for i in range(layers)
        ],
        "attention_bias": True,
        "swiglu_limit": 7.0,
        "rope_parameters": {
            "rope_type": "yarn",
            "rope_theta": 150000.0,
            "factor": 32.0,
            "original_max_position_embeddings": 4096,
            "beta_fast": 32.0,
            "beta_slow": 1.0,
            "truncate": False,
        },
    }


FAMILY = ModelFamily(
    name="gpt_oss",
    module="hybridkv.model.models.gpt_oss",
    architectures={"GptOssForCausalLM": "GptOssForCausalLM"},
    model_types=("gpt_oss",),
    layer_kinds=frozenset({LayerKind.FULL, LayerKind.SLIDING}),
    make_config=make_config,
)
