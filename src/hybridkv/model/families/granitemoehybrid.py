"""Granite 4.0-H: Mamba2 layers with attention every 4th, optional MoE, MuP multipliers
(``models/granitemoehybrid.py``)."""

from __future__ import annotations

from typing import Any

from hybridkv.model.config.layer_kinds import LayerKind
from hybridkv.model.families.family import ModelFamily


def make_config(tiny: bool) -> dict[str, Any]:
    layers = 4 if tiny else 12
    hidden = 64 if tiny else 768
    return {
        "architectures": ["GraniteMoeHybridForCausalLM"],
        "model_type": "granitemoehybrid",
        "hidden_size": hidden,
        "intermediate_size": 64 if tiny else 1024,
        "shared_intermediate_size": 128 if tiny else 2048,
        "num_hidden_layers": layers,
        "num_attention_heads": 4 if tiny else 12,
        "num_key_value_heads": 2 if tiny else 4,
        "hidden_act": "silu",
        "layer_types": ["attention" if i % 4 == 3 else "mamba" for i in range(layers)],
        "mamba_n_heads": 4 if tiny else 24,
        "mamba_d_head": 2 * hidden // (4 if tiny else 24),
        "mamba_d_state": 16 if tiny else 64,
        "mamba_n_groups": 1,
        "mamba_d_conv": 4,
        "mamba_expand": 2,
        "mamba_chunk_size": 16 if tiny else 64,
        "mamba_conv_bias": True,
        "mamba_proj_bias": False,
        "num_local_experts": 0,
        "num_experts_per_tok": 0,
        "position_embedding_type": "rope",
        "rope_theta": 10000.0,
        "embedding_multiplier": 12.0,
        "attention_multiplier": 1.0 / (16 if tiny else 64),
        "residual_multiplier": 0.22,
        "logits_scaling": 2.0,
        "tie_word_embeddings": False,
    }


FAMILY = ModelFamily(
    name="granitemoehybrid",
    module="hybridkv.model.models.granitemoehybrid",
    architectures={"GraniteMoeHybridForCausalLM": "GraniteMoeHybridForCausalLM"},
    model_types=("granitemoehybrid",),
    layer_kinds=frozenset({LayerKind.FULL, LayerKind.MAMBA}),
    make_config=make_config,
    renames={  # transformers 5.x names of the MoE weights
        "block_sparse_moe.input_linear.weight": ("block_sparse_moe.experts.gate_up_proj",),
        "block_sparse_moe.output_linear.weight": ("block_sparse_moe.experts.down_proj",),
        "block_sparse_moe.router.layer.weight": ("block_sparse_moe.router.weight",),
    },
)
