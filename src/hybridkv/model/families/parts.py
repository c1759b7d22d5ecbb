"""Parts that several families' make-model configs share (tiny: tests; small: 50-150M
parameters, benchmarks). Each returns a piece of config.json."""

from __future__ import annotations

from typing import Any


def size(tiny: bool, small: Any, little: Any) -> Any:
    return little if tiny else small


def attention_part(tiny: bool, head_dim: int = 64) -> dict[str, Any]:
    return {
        "hidden_size": size(tiny, 768, 64),
        "num_attention_heads": size(tiny, 12, 4),
        "num_key_value_heads": size(tiny, 4, 2),
        "head_dim": size(tiny, head_dim, 16),
        "hidden_act": "silu",
        "tie_word_embeddings": False,
    }


def mamba_part(tiny: bool) -> dict[str, Any]:
    return {
        "mamba_n_heads": size(tiny, 24, 4),
        "mamba_d_head": size(tiny, 64, 32),
        "mamba_d_state": size(tiny, 64, 16),
        "mamba_n_groups": 1,
        "mamba_d_conv": 4,
        "mamba_expand": 2,
        "mamba_chunk_size": size(tiny, 64, 16),
        "mamba_conv_bias": True,
        "mamba_proj_bias": False,
    }


def gdn_part(tiny: bool, layers: int) -> dict[str, Any]:
    """Gated DeltaNet 3 : 1 full attention, RoPE on a quarter of the head."""
    return {
        "num_hidden_layers": layers,
        "layer_types": [
            "full_attention" if i % 4 == 3 else "linear_attention" for i in range(layers)
        ],
        "linear_num_key_heads": size(tiny, 8, 2),
        "linear_num_value_heads": size(tiny, 16, 4),
        "linear_key_head_dim": size(tiny, 64, 16),
        "linear_value_head_dim": size(tiny, 64, 16),
        "linear_conv_kernel_dim": 4,
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": 10000.0,
            "partial_rotary_factor": 0.25,
        },
    }
