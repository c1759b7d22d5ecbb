"""Qwen3-Next: Gated DeltaNet 3 : 1 gated attention, MoE with a shared expert
(``models/qwen3_next.py``); its checkpoints keep each expert in its own tensor."""

from __future__ import annotations

from typing import Any

from hybridkv.model.config.layer_kinds import LayerKind
from hybridkv.model.families.family import ModelFamily
from hybridkv.model.families.parts import attention_part, gdn_part, size


def make_config(tiny: bool) -> dict[str, Any]:
    return {
        "architectures": ["Qwen3NextForCausalLM"],
        "model_type": "qwen3_next",
        **attention_part(tiny),
        **gdn_part(tiny, size(tiny, 12, 4)),
        "intermediate_size": size(tiny, 2048, 128),
        "num_experts": size(tiny, 8, 4),
        "num_experts_per_tok": 2,
        "moe_intermediate_size": size(tiny, 256, 64),
        "shared_expert_intermediate_size": size(tiny, 512, 64),
        "decoder_sparse_step": 1,
        "norm_topk_prob": True,
    }


FAMILY = ModelFamily(
    name="qwen3_next",
    module="hybridkv.model.models.qwen3_next",
    architectures={"Qwen3NextForCausalLM": "Qwen3NextForCausalLM"},
    model_types=("qwen3_next",),
    layer_kinds=frozenset({LayerKind.FULL, LayerKind.GDN}),
    make_config=make_config,
    offset_norms=True,
    saved_split_experts=True,
)
