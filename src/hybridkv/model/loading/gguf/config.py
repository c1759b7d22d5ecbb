"""A GGUF file's architecture and hyperparameters as the ``config.json`` transformers would
have written for the same model, so ``build_model_config`` validates both alike.

llama.cpp's converter writes ``<arch>.<key>`` metadata and leaves some of a family's constants
out of the file (its loader hard-codes them): those come from the table here, each with the
reason. Families llama.cpp converts and hybridkv reads from GGUF: ``GGUF_ARCHS``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hybridkv.model.config.errors import ModelLoadError
from hybridkv.model.loading.gguf.config_gdn import GDN_ARCHS, qwen_gdn
from hybridkv.model.loading.gguf.config_gpt_oss import gpt_oss
from hybridkv.model.loading.gguf.config_hybrid import falcon_h1, nemotron_h
from hybridkv.model.loading.gguf.file import GgufFile
from hybridkv.model.loading.gguf.hparams import (
    common_config,
    get_bool,
    kv_heads_per_layer,
    mamba_sizes,
    ssm_int,
)

# llama.cpp's Gemma 3: every 6th layer global, the rest sliding; local RoPE base 10,000
GEMMA3_SWA_PATTERN = 6
GEMMA3_LOCAL_ROPE_THETA = 10000.0
GEMMA3_27B_LAYERS = 62  # the one size that scales queries by hidden / heads, not head_dim


def gguf_config_json(file: GgufFile) -> dict[str, Any]:
    """The ``config.json`` dict of ``file``'s model; ``ModelLoadError`` for an architecture
    hybridkv does not read from GGUF."""
    build = _BUILDERS.get(file.architecture)
    if build is None:
        raise ModelLoadError(
            f"{file.path}: GGUF architecture {file.architecture!r} is not supported "
            f"(supported: {', '.join(sorted(_BUILDERS))})"
        )
    return build(file)


def _with_ffn(file: GgufFile) -> dict[str, Any]:
    config = common_config(file)
    config["intermediate_size"] = file.get_int(f"{file.architecture}.feed_forward_length", low=1)
    return config


def _qwen3(file: GgufFile) -> dict[str, Any]:
    # llama.cpp runs Qwen3 without sliding windows (the released checkpoints use none)
    return {
        **_with_ffn(file),
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "hidden_act": "silu",
        "use_sliding_window": False,
    }


def _gemma3(file: GgufFile) -> dict[str, Any]:
    config = _with_ffn(file)
    scalar = config["head_dim"]
    if config["num_hidden_layers"] == GEMMA3_27B_LAYERS:
        scalar = config["hidden_size"] // config["num_attention_heads"]
    config.update(
        architectures=["Gemma3ForCausalLM"],
        model_type="gemma3_text",
        hidden_activation="gelu_pytorch_tanh",
        query_pre_attn_scalar=scalar,
        sliding_window=file.get_int("gemma3.attention.sliding_window", low=1),
        sliding_window_pattern=GEMMA3_SWA_PATTERN,
        rope_local_base_freq=GEMMA3_LOCAL_ROPE_THETA,
        final_logit_softcapping=None,
        attn_logit_softcapping=None,
    )
    if file.has("gemma3.rope.scaling.factor"):
        factor = file.get_float("gemma3.rope.scaling.factor")
        config["rope_scaling"] = {"rope_type": "linear", "factor": factor}
    return config


def _granite_hybrid(file: GgufFile) -> dict[str, Any]:
    """Granite 4.0-H. llama.cpp applies RoPE only where ``rope.scaling.finetuned`` says so
    (its converter writes False for every model with Mamba2 layers); the Mamba2 chunk size is
    not in the file (it changes float summation order only): transformers' default."""
    config, a = _with_ffn(file), file.architecture
    kv = kv_heads_per_layer(file, config["num_attention_heads"])
    hidden = config["hidden_size"]
    inner, heads = mamba_sizes(file, hidden)
    experts = file.get_int(f"{a}.expert_count", 0)
    shared = f"{a}.expert_shared_feed_forward_length"
    rope = get_bool(file, f"{a}.rope.scaling.finetuned", True)
    config.update(
        architectures=["GraniteMoeHybridForCausalLM"],
        model_type="granitemoehybrid",
        hidden_act="silu",
        head_dim=hidden // config["num_attention_heads"],  # Granite's converter drops it
        shared_intermediate_size=file.get_int(shared, config["intermediate_size"], low=1),
        layer_types=["attention" if k else "mamba" for k in kv],
        mamba_n_heads=heads,
        mamba_d_head=inner // heads,
        mamba_d_state=ssm_int(file, "state_size"),
        mamba_n_groups=ssm_int(file, "group_count", 1),
        mamba_d_conv=ssm_int(file, "conv_kernel", high=64),
        mamba_expand=inner // hidden,
        mamba_conv_bias="blk.0.ssm_conv1d.bias" in file.tensors,
        mamba_proj_bias="blk.0.ssm_in.bias" in file.tensors,
        num_local_experts=experts,
        num_experts_per_tok=file.get_int(f"{a}.expert_used_count", 0, high=max(experts, 0)),
        position_embedding_type="rope" if rope else "nope",
        embedding_multiplier=file.get_float(f"{a}.embedding_scale", 1.0),
        attention_multiplier=file.get_float(f"{a}.attention.scale", config["head_dim"] ** -0.5),
        residual_multiplier=file.get_float(f"{a}.residual_scale", 1.0),
        logits_scaling=file.get_float(f"{a}.logit_scale", 1.0),
    )
    if inner % hidden:
        raise ModelLoadError(f"{file.path}: ssm.inner_size {inner} does not split evenly")
    return config


_BUILDERS: dict[str, Callable[[GgufFile], dict[str, Any]]] = {
    "qwen3": _qwen3,
    "gemma3": _gemma3,
    "granitehybrid": _granite_hybrid,
    "nemotron_h": nemotron_h,
    "nemotron_h_moe": nemotron_h,
    "falcon-h1": falcon_h1,
    **dict.fromkeys(GDN_ARCHS, qwen_gdn),
    "gpt-oss": gpt_oss,
}
GGUF_ARCHS = tuple(_BUILDERS)
# what llama.cpp's converter added to these families' norm weights (the model adds it back)
NORM_SHIFT: dict[str, float] = {"gemma3": 1.0, **dict.fromkeys(GDN_ARCHS, 1.0)}
UNSHIFTED_NORM = "linear_attn.norm.weight"  # a DeltaNet's output norm: written without the +1
