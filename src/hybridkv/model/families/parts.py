"""``make_model`` configs of the families added in issue 14 (tiny: tests; small: 50-150M
parameters, benchmarks). Each returns the architecture-specific part of config.json."""

from __future__ import annotations

from typing import Any


def _size(tiny: bool, small: Any, little: Any) -> Any:
    return little if tiny else small


def _attention(tiny: bool, head_dim: int = 64) -> dict[str, Any]:
    return {
        "hidden_size": _size(tiny, 768, 64),
        "num_attention_heads": _size(tiny, 12, 4),
        "num_key_value_heads": _size(tiny, 4, 2),
        "head_dim": _size(tiny, head_dim, 16),
        "hidden_act": "silu",
        "tie_word_embeddings": False,
    }


def _mamba(tiny: bool) -> dict[str, Any]:
    return {
        "mamba_n_heads": _size(tiny, 24, 4),
        "mamba_d_head": _size(tiny, 64, 32),
        "mamba_d_state": _size(tiny, 64, 16),
        "mamba_n_groups": 1,
        "mamba_d_conv": 4,
        "mamba_expand": 2,
        "mamba_chunk_size": _size(tiny, 64, 16),
        "mamba_conv_bias": True,
        "mamba_proj_bias": False,
    }


def bamba(tiny: bool) -> dict[str, Any]:
    layers = _size(tiny, 12, 4)
    return {
        "architectures": ["BambaForCausalLM"],
        "model_type": "bamba",
        **_attention(tiny),
        **_mamba(tiny),
        "intermediate_size": _size(tiny, 2048, 128),
        "num_hidden_layers": layers,
        "attn_layer_indices": [i for i in range(layers) if i % 4 == 3],
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
    }


def nemotron_h(tiny: bool) -> dict[str, Any]:
    pattern = _size(tiny, "M-ME*M-M-ME*", "M-ME*M")
    return {
        "architectures": ["NemotronHForCausalLM"],
        "model_type": "nemotron_h",
        **_attention(tiny),
        "intermediate_size": _size(tiny, 2048, 128),
        "num_hidden_layers": len(pattern),
        "hybrid_override_pattern": pattern,
        "mlp_hidden_act": "relu2",
        "mamba_num_heads": _size(tiny, 24, 4),
        "mamba_head_dim": _size(tiny, 64, 32),
        "ssm_state_size": _size(tiny, 64, 16),
        "n_groups": 1,
        "conv_kernel": 4,
        "chunk_size": _size(tiny, 64, 16),
        "n_routed_experts": _size(tiny, 16, 4),
        "num_experts_per_tok": 2,
        "moe_intermediate_size": _size(tiny, 512, 64),
        "moe_shared_expert_intermediate_size": _size(tiny, 1024, 64),
        "layer_norm_epsilon": 1e-5,
    }


def falcon_h1(tiny: bool) -> dict[str, Any]:
    return {
        "architectures": ["FalconH1ForCausalLM"],
        "model_type": "falcon_h1",
        **_attention(tiny),
        **_mamba(tiny),
        "mamba_d_ssm": _size(tiny, 1536, 128),
        "intermediate_size": _size(tiny, 2048, 128),
        "num_hidden_layers": _size(tiny, 8, 3),
        "embedding_multiplier": 2.0,
        "lm_head_multiplier": 0.5,
        "key_multiplier": 0.8,
        "ssm_multipliers": [1.0, 0.9, 1.1, 0.9, 1.0],
        "mlp_multipliers": [1.1, 0.9],
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
    }


def _gdn(tiny: bool, layers: int) -> dict[str, Any]:
    return {
        "num_hidden_layers": layers,
        "layer_types": [
            "full_attention" if i % 4 == 3 else "linear_attention" for i in range(layers)
        ],
        "linear_num_key_heads": _size(tiny, 8, 2),
        "linear_num_value_heads": _size(tiny, 16, 4),
        "linear_key_head_dim": _size(tiny, 64, 16),
        "linear_value_head_dim": _size(tiny, 64, 16),
        "linear_conv_kernel_dim": 4,
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": 10000.0,
            "partial_rotary_factor": 0.25,
        },
    }


def qwen3_next(tiny: bool) -> dict[str, Any]:
    return {
        "architectures": ["Qwen3NextForCausalLM"],
        "model_type": "qwen3_next",
        **_attention(tiny),
        **_gdn(tiny, _size(tiny, 12, 4)),
        "intermediate_size": _size(tiny, 2048, 128),
        "num_experts": _size(tiny, 8, 4),
        "num_experts_per_tok": 2,
        "moe_intermediate_size": _size(tiny, 256, 64),
        "shared_expert_intermediate_size": _size(tiny, 512, 64),
        "decoder_sparse_step": 1,
        "norm_topk_prob": True,
    }


def qwen3_5(tiny: bool) -> dict[str, Any]:
    return {
        "architectures": ["Qwen3_5ForCausalLM"],
        "model_type": "qwen3_5_text",
        **_attention(tiny),
        **_gdn(tiny, _size(tiny, 12, 4)),
        "intermediate_size": _size(tiny, 2048, 128),
    }


def gpt_oss(tiny: bool) -> dict[str, Any]:
    layers = _size(tiny, 12, 4)
    return {
        "architectures": ["GptOssForCausalLM"],
        "model_type": "gpt_oss",
        **_attention(tiny),
        "num_hidden_layers": layers,
        "intermediate_size": _size(tiny, 512, 64),
        "num_local_experts": _size(tiny, 8, 4),
        "num_experts_per_tok": 2,
        "sliding_window": _size(tiny, 128, 32),
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


FAMILY_CONFIGS = {
    "bamba": bamba,
    "nemotron_h": nemotron_h,
    "falcon_h1": falcon_h1,
    "qwen3_next": qwen3_next,
    "qwen3_5": qwen3_5,
    "gpt_oss": gpt_oss,
}
