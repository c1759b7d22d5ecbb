"""Qwen3: full and sliding-window attention layers (``models/qwen3.py``)."""

from __future__ import annotations

from typing import Any

from hybridkv.model.config.layer_kinds import LayerKind
from hybridkv.model.families.family import ModelFamily


def make_config(tiny: bool) -> dict[str, Any]:
    layers = 4 if tiny else 12
    return {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "hidden_size": 64 if tiny else 768,
        "intermediate_size": 128 if tiny else 2048,
        "num_hidden_layers": layers,
        "num_attention_heads": 4 if tiny else 12,
        "num_key_value_heads": 2 if tiny else 4,
        "head_dim": 16 if tiny else 64,
        "hidden_act": "silu",
        "rope_theta": 10000.0,
        "use_sliding_window": True,
        "sliding_window": 32 if tiny else 512,
        "max_window_layers": layers // 2,
        "layer_types": [
            "full_attention" if i % 2 == 0 else "sliding_attention" for i in range(layers)
        ],
        "tie_word_embeddings": False,
    }


def make_full_config(tiny: bool) -> dict[str, Any]:
    """Full attention on every layer: vLLM's CPU backend refuses checkpoints with sliding
    windows on some layers only (the vLLM baseline runs this one)."""
    config = make_config(tiny)
    layers = config["num_hidden_layers"]
    config.update(
        use_sliding_window=False,
        sliding_window=None,
        max_window_layers=layers,
        layer_types=["full_attention"] * layers,
    )
    return config


FAMILY = ModelFamily(
    name="qwen3",
    module="hybridkv.model.models.qwen3",
    architectures={"Qwen3ForCausalLM": "Qwen3ForCausalLM"},
    model_types=("qwen3",),
    layer_kinds=frozenset({LayerKind.FULL, LayerKind.SLIDING}),
    make_config=make_config,
    variants={"qwen3_full": make_full_config},
)
