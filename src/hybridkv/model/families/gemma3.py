"""Gemma 3: five sliding-window layers to one full, soft-capped logits, and its multimodal
checkpoints run as their text model (``models/gemma3.py``)."""

from __future__ import annotations

from typing import Any

from hybridkv.model.config.layer_kinds import LayerKind
from hybridkv.model.families.family import ModelFamily


def make_config(tiny: bool) -> dict[str, Any]:
    return {
        "architectures": ["Gemma3ForCausalLM"],
        "model_type": "gemma3_text",
        "hidden_size": 64 if tiny else 768,
        "intermediate_size": 128 if tiny else 2048,
        "num_hidden_layers": 6 if tiny else 12,
        "num_attention_heads": 4 if tiny else 12,
        "num_key_value_heads": 2 if tiny else 4,
        "head_dim": 16 if tiny else 64,
        "query_pre_attn_scalar": 16 if tiny else 64,
        "hidden_activation": "gelu_pytorch_tanh",
        "sliding_window": 32 if tiny else 512,
        "sliding_window_pattern": 6,
        "rope_theta": 1_000_000.0,
        "rope_local_base_freq": 10_000.0,
        "final_logit_softcapping": 30.0,
        "attn_logit_softcapping": None,
        "tie_word_embeddings": True,
    }


FAMILY = ModelFamily(
    name="gemma3",
    module="hybridkv.model.models.gemma3",
    architectures={
        "Gemma3ForCausalLM": "Gemma3ForCausalLM",
        "Gemma3ForConditionalGeneration": "Gemma3ForConditionalGeneration",
    },
    model_types=("gemma3", "gemma3_text"),
    layer_kinds=frozenset({LayerKind.FULL, LayerKind.SLIDING}),
    make_config=make_config,
    offset_norms=True,
)
