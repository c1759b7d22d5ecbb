"""Nemotron-H: a pattern of Mamba2, attention, MLP and MoE layers (``models/nemotron_h.py``);
its checkpoints keep the model under ``backbone.`` and each expert in its own tensor."""

from __future__ import annotations

from typing import Any

from hybridkv.model.config.layer_kinds import LayerKind
from hybridkv.model.families.family import ModelFamily
from hybridkv.model.families.parts import attention_part, size


def make_config(tiny: bool) -> dict[str, Any]:
    pattern = size(tiny, "M-ME*M-M-ME*", "M-ME*M")
    return {
        "architectures": ["NemotronHForCausalLM"],
        "model_type": "nemotron_h",
        **attention_part(tiny),
        "intermediate_size": size(tiny, 2048, 128),
        "num_hidden_layers": len(pattern),
        "hybrid_override_pattern": pattern,
        "mlp_hidden_act": "relu2",
        "mamba_num_heads": size(tiny, 24, 4),
        "mamba_head_dim": size(tiny, 64, 32),
        "ssm_state_size": size(tiny, 64, 16),
        "n_groups": 1,
        "conv_kernel": 4,
        "chunk_size": size(tiny, 64, 16),
        "n_routed_experts": size(tiny, 16, 4),
        "num_experts_per_tok": 2,
        "moe_intermediate_size": size(tiny, 512, 64),
        "moe_shared_expert_intermediate_size": size(tiny, 1024, 64),
        "layer_norm_epsilon": 1e-5,
    }


FAMILY = ModelFamily(
    name="nemotron_h",
    module="hybridkv.model.models.nemotron_h",
    architectures={"NemotronHForCausalLM": "NemotronHForCausalLM"},
    model_types=("nemotron_h",),
    layer_kinds=frozenset({LayerKind.FULL, LayerKind.MAMBA, LayerKind.MLP}),
    make_config=make_config,
    saved_prefix=("model.", "backbone."),
    saved_split_experts=True,
)
