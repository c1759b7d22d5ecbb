"""``config.json`` of the Gated DeltaNet families llama.cpp converts: Qwen3-Next
(``qwen3next``: MoE on every layer, fused DeltaNet projections) and Qwen3.5 (``qwen35``
dense, ``qwen35moe``; separate projections). ``sources_gdn`` undoes their tensor
rewrites."""

from __future__ import annotations

from typing import Any

from hybridkv.model.config.errors import ModelLoadError
from hybridkv.model.loading.gguf.file import GgufFile
from hybridkv.model.loading.gguf.hparams import common_config, ssm_int

# GGUF architecture -> (transformers architecture, model_type)
_NAMES = {
    "qwen3next": ("Qwen3NextForCausalLM", "qwen3_next"),
    "qwen35": ("Qwen3_5ForCausalLM", "qwen3_5_text"),
    "qwen35moe": ("Qwen3_5MoeForCausalLM", "qwen3_5_moe_text"),
}
GDN_ARCHS = tuple(_NAMES)


def qwen_gdn(file: GgufFile) -> dict[str, Any]:
    """Layer kinds from ``attention.recurrent_layers`` (else every ``full_attention_interval``
    -th layer is attention); the DeltaNet sizes from ``ssm.*`` (llama.cpp's names: key heads
    ``group_count`` of ``state_size``, value heads ``time_step_rank``, their total width
    ``inner_size``); the rotated share of a head from ``rope.dimension_count``. Qwen3.5's
    multimodal RoPE sections change nothing for text (every section sees the same position).
    """
    config, a = common_config(file), file.architecture
    arch, model_type = _NAMES[a]
    value_heads, key_heads = ssm_int(file, "time_step_rank"), ssm_int(file, "group_count")
    inner = ssm_int(file, "inner_size")
    if inner % value_heads or value_heads % key_heads:
        raise ModelLoadError(f"{file.path}: ssm sizes do not split into heads ({inner}, "
                             f"{value_heads} value heads, {key_heads} key heads)")  # fmt: skip
    config.update(
        architectures=[arch],
        model_type=model_type,
        hidden_act="silu",
        intermediate_size=file.get_int(f"{a}.feed_forward_length", low=1),
        layer_types=_layer_types(file, config["num_hidden_layers"]),
        linear_conv_kernel_dim=ssm_int(file, "conv_kernel", high=64),
        linear_key_head_dim=ssm_int(file, "state_size"),
        linear_num_key_heads=key_heads,
        linear_num_value_heads=value_heads,
        linear_value_head_dim=inner // value_heads,
        rope_parameters=_rope(file, config),
    )
    if file.has(f"{a}.expert_count"):
        config.update(_experts(file))
    return config


def _layer_types(file: GgufFile, layers: int) -> list[str]:
    a = file.architecture
    recurrent = file.get(f"{a}.attention.recurrent_layers")
    if recurrent is None:
        every = file.get_int(f"{a}.full_attention_interval", 4, low=1)
        recurrent = [(i + 1) % every != 0 for i in range(layers)]
    if not isinstance(recurrent, list) or len(recurrent) != layers:
        raise ModelLoadError(f"{file.path}: metadata 'attention.recurrent_layers' must list "
                             f"{layers} bools")  # fmt: skip
    if not all(isinstance(r, bool) for r in recurrent):
        raise ModelLoadError(f"{file.path}: metadata 'attention.recurrent_layers' must be bools")
    return ["linear_attention" if r else "full_attention" for r in recurrent]


def _rope(file: GgufFile, config: dict[str, Any]) -> dict[str, Any]:
    head_dim = config["head_dim"]
    rotated = file.get_int(f"{file.architecture}.rope.dimension_count", head_dim, low=2)
    factor = rotated / head_dim
    if rotated > head_dim or int(head_dim * factor) != rotated:
        raise ModelLoadError(f"{file.path}: rope.dimension_count {rotated} does not fit a head")
    theta = config["rope_theta"]
    return {"rope_type": "default", "rope_theta": theta, "partial_rotary_factor": factor}


def _experts(file: GgufFile) -> dict[str, Any]:
    """MoE on every layer (llama.cpp has no dense layer between), renormalised top-k."""
    a = file.architecture
    experts = file.get_int(f"{a}.expert_count", low=1, high=1 << 16)
    return {
        "num_experts": experts,
        "num_experts_per_tok": file.get_int(f"{a}.expert_used_count", low=1, high=experts),
        "moe_intermediate_size": file.get_int(f"{a}.expert_feed_forward_length", low=1),
        "shared_expert_intermediate_size": file.get_int(
            f"{a}.expert_shared_feed_forward_length", low=1
        ),
        "decoder_sparse_step": 1,
        "norm_topk_prob": True,
    }
