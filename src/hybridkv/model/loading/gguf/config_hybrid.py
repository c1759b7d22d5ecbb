"""``config.json`` of the Mamba2 hybrids llama.cpp converts besides Granite: Nemotron-H
(``nemotron_h``, and ``nemotron_h_moe`` when the checkpoint has experts) and Falcon-H1
(``falcon-h1``). What the converter leaves out of the file, and what it folds into the
weights, is said per builder."""

from __future__ import annotations

from typing import Any

from hybridkv.model.config.errors import ModelLoadError
from hybridkv.model.loading.gguf.file import GgufFile
from hybridkv.model.loading.gguf.hparams import (
    common_config,
    get_bool,
    kv_heads_per_layer,
    mamba_sizes,
    ssm_int,
)


def nemotron_h(file: GgufFile) -> dict[str, Any]:
    """Nemotron-H. The layer pattern is not in the file: a layer with KV heads is attention
    (``*``), one with ``ffn_up_exps`` a MoE (``E``), one with ``ffn_up`` an MLP (``-``), the
    rest Mamba2 (``M``). llama.cpp hard-codes the squared-ReLU MLP and attention without RoPE
    (the converter still permutes q/k rows: ``sources`` puts them back). The norms'
    epsilon is ``attention.layer_norm_epsilon`` (the checkpoint's ``layer_norm_epsilon``,
    which its model reads). Not in the file: the Mamba2 chunk size (summation order only) and
    ``time_step_min`` (transformers' defaults)."""
    config, a = common_config(file), file.architecture
    hidden = config["hidden_size"]
    inner, heads = mamba_sizes(file, hidden)
    pattern = _nemotron_pattern(file, kv_heads_per_layer(file, config["num_attention_heads"]))
    mlp = next((i for i, c in enumerate(pattern) if c == "-"), None)
    config.update(
        architectures=["NemotronHForCausalLM"],
        model_type="nemotron_h",
        hybrid_override_pattern=pattern,
        intermediate_size=_rows(file, f"blk.{mlp}.ffn_up.weight") if mlp is not None else 1,
        mlp_hidden_act="relu2",
        layer_norm_epsilon=file.get_float(
            f"{a}.attention.layer_norm_epsilon", config["rms_norm_eps"]
        ),
        mamba_num_heads=heads,
        mamba_head_dim=inner // heads,
        ssm_state_size=ssm_int(file, "state_size"),
        n_groups=ssm_int(file, "group_count", 1),
        conv_kernel=ssm_int(file, "conv_kernel", high=64),
        use_conv_bias=_first_ssm_has(file, pattern, "ssm_conv1d.bias"),
        use_bias=_first_ssm_has(file, pattern, "ssm_in.bias"),
    )
    if "E" in pattern:
        config.update(_nemotron_moe(file))
    return config


def _nemotron_pattern(file: GgufFile, kv: list[int]) -> str:
    def kind(i: int) -> str:
        if kv[i]:
            return "*"
        if f"blk.{i}.ffn_up_exps.weight" in file.tensors:
            return "E"
        return "-" if f"blk.{i}.ffn_up.weight" in file.tensors else "M"

    return "".join(kind(i) for i in range(len(kv)))


def _nemotron_moe(file: GgufFile) -> dict[str, Any]:
    a = file.architecture
    experts = file.get_int(f"{a}.expert_count", low=1, high=1 << 16)
    groups = file.get_int(f"{a}.expert_group_count", 1, low=1, high=experts)
    latent = file.get_int(f"{a}.moe_latent_size", 0)
    if experts % groups:
        raise ModelLoadError(f"{file.path}: {experts} experts do not split into {groups} groups")
    return {
        "n_routed_experts": experts,
        "num_experts_per_tok": file.get_int(f"{a}.expert_used_count", low=1, high=experts),
        "moe_intermediate_size": file.get_int(f"{a}.expert_feed_forward_length", low=1),
        "moe_shared_expert_intermediate_size": file.get_int(
            f"{a}.expert_shared_feed_forward_length", low=1
        ),
        "n_group": groups,
        "topk_group": file.get_int(f"{a}.expert_group_used_count", 1, low=1, high=groups),
        "norm_topk_prob": get_bool(file, f"{a}.expert_weights_norm", True),
        "routed_scaling_factor": file.get_float(f"{a}.expert_weights_scale", 1.0),
        "moe_latent_size": latent or None,
    }


def falcon_h1(file: GgufFile) -> dict[str, Any]:
    """Falcon-H1. The converter multiplies every MuP multiplier into the weights (the
    embedding, lm_head, q/k/v, o, the MLP's gate and down, the Mamba2 in/out projections, the
    in-projection's z/x/B/C/dt sections) and writes none of them: here they are all 1. With a
    gated norm (``ssm_norm``) llama.cpp gates then normalises: ``mamba_norm_before_gate``
    false says the same."""
    config = common_config(file)
    hidden = config["hidden_size"]
    inner, heads = mamba_sizes(file, hidden)
    config.update(
        architectures=["FalconH1ForCausalLM"],
        model_type="falcon_h1",
        hidden_act="silu",
        intermediate_size=file.get_int(f"{file.architecture}.feed_forward_length", low=1),
        attention_bias="blk.0.attn_q.bias" in file.tensors,
        mlp_bias="blk.0.ffn_up.bias" in file.tensors,
        mamba_d_ssm=inner,
        mamba_n_heads=heads,
        mamba_d_head=inner // heads,
        mamba_d_state=ssm_int(file, "state_size"),
        mamba_n_groups=ssm_int(file, "group_count", 1),
        mamba_d_conv=ssm_int(file, "conv_kernel", high=64),
        mamba_conv_bias="blk.0.ssm_conv1d.bias" in file.tensors,
        mamba_proj_bias="blk.0.ssm_in.bias" in file.tensors,
        mamba_rms_norm="blk.0.ssm_norm.weight" in file.tensors,
        mamba_norm_before_gate=False,
        rope_parameters={"rope_type": "default", "rope_theta": config["rope_theta"]},
        **dict.fromkeys(_FALCON_SCALARS, 1.0),
        ssm_multipliers=[1.0] * 5,
        mlp_multipliers=[1.0, 1.0],
    )
    return config


_FALCON_SCALARS = (
    "embedding_multiplier",
    "lm_head_multiplier",
    "key_multiplier",
    "attention_in_multiplier",
    "attention_out_multiplier",
    "ssm_in_multiplier",
    "ssm_out_multiplier",
)


def _rows(file: GgufFile, name: str) -> int:
    tensor = file.tensors.get(name)
    if tensor is None or len(tensor.shape) != 2:
        raise ModelLoadError(f"{file.path}: no 2-D {name!r} tensor")
    return tensor.shape[0]


def _first_ssm_has(file: GgufFile, pattern: str, tensor: str) -> bool:
    layer = pattern.find("M")
    return layer >= 0 and f"blk.{layer}.{tensor}" in file.tensors
