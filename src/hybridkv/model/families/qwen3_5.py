"""Qwen3.5 dense, MoE and multimodal (run as its text model): Qwen3-Next's layers with
separate projections (``models/qwen3_next.py``)."""

from __future__ import annotations

from typing import Any

from hybridkv.model.config.layer_kinds import LayerKind
from hybridkv.model.families.family import ModelFamily
from hybridkv.model.families.parts import attention_part, gdn_part, size


def make_config(tiny: bool) -> dict[str, Any]:
    return {
        "architectures": ["Qwen3_5ForCausalLM"],
        "model_type": "qwen3_5_text",
        **attention_part(tiny),
        **gdn_part(tiny, size(tiny, 12, 4)),
        "intermediate_size": size(tiny, 2048, 128),
    }


FAMILY = ModelFamily(
    name="qwen3_5",
    module="hybridkv.model.models.qwen3_next",
    architectures={
        "Qwen3_5ForCausalLM": "Qwen3_5ForCausalLM",
        "Qwen3_5ForConditionalGeneration": "Qwen3_5ForConditionalGeneration",
        "Qwen3_5MoeForCausalLM": "Qwen3_5ForCausalLM",
    },
    model_types=("qwen3_5", "qwen3_5_text", "qwen3_5_moe", "qwen3_5_moe_text"),
    layer_kinds=frozenset({LayerKind.FULL, LayerKind.GDN}),
    make_config=make_config,
    offset_norms=True,
)
