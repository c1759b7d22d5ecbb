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
from hybridkv.model.loading.gguf_file import MAX_DIM, GgufFile

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


def _common(file: GgufFile) -> dict[str, Any]:
    a = file.architecture
    heads = file.get_int(f"{a}.attention.head_count", low=1)
    hidden = file.get_int(f"{a}.embedding_length", low=1)
    embed = file.tensors.get("token_embd.weight")
    if embed is None or len(embed.shape) != 2:
        raise ModelLoadError(f"{file.path}: no 2-D 'token_embd.weight' tensor")
    return {
        "vocab_size": embed.shape[0],
        "hidden_size": hidden,
        "intermediate_size": file.get_int(f"{a}.feed_forward_length", low=1),
        "num_hidden_layers": file.get_int(f"{a}.block_count", low=1, high=4096),
        "num_attention_heads": heads,
        "num_key_value_heads": max(_kv_heads_per_layer(file, heads)),
        "head_dim": file.get_int(f"{a}.attention.key_length", hidden // heads, low=1),
        "max_position_embeddings": file.get_int(f"{a}.context_length", 4096, low=1),
        "rms_norm_eps": file.get_float(f"{a}.attention.layer_norm_rms_epsilon", 1e-6),
        "rope_theta": file.get_float(f"{a}.rope.freq_base", 10000.0),
        "tie_word_embeddings": "output.weight" not in file.tensors,
        "torch_dtype": "float32",
        **_special_ids(file, embed.shape[0]),
    }


def _kv_heads_per_layer(file: GgufFile, heads: int) -> list[int]:
    """KV heads of each layer: one number for all, or (hybrids) one per layer, 0 for a layer
    without attention."""
    a, key = file.architecture, f"{file.architecture}.attention.head_count_kv"
    layers = file.get_int(f"{a}.block_count", low=1, high=4096)
    if isinstance(file.get(key), list):
        kv = file.get_ints(key, layers)
        if not all(0 <= k <= MAX_DIM for k in kv) or max(kv) < 1:
            raise ModelLoadError(f"{file.path}: metadata {key!r} has no layer with KV heads")
        return kv
    return [file.get_int(key, heads, low=1)] * layers


def _special_ids(file: GgufFile, vocab_size: int) -> dict[str, Any]:
    ids: dict[str, Any] = {}
    for ours, theirs in (("bos", "bos"), ("eos", "eos"), ("pad", "padding")):
        key = f"tokenizer.ggml.{theirs}_token_id"
        ids[f"{ours}_token_id"] = file.get_int(key, high=vocab_size - 1) if file.has(key) else None
    return ids


def _qwen3(file: GgufFile) -> dict[str, Any]:
    # llama.cpp runs Qwen3 without sliding windows (the released checkpoints use none)
    return {
        **_common(file),
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "hidden_act": "silu",
        "use_sliding_window": False,
    }


def _gemma3(file: GgufFile) -> dict[str, Any]:
    config = _common(file)
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
    config, a = _common(file), file.architecture
    kv = _kv_heads_per_layer(file, config["num_attention_heads"])
    hidden, heads = config["hidden_size"], file.get_int(f"{a}.ssm.time_step_rank", low=1)
    inner = file.get_int(f"{a}.ssm.inner_size", low=1)
    experts = file.get_int(f"{a}.expert_count", 0)
    shared = f"{a}.expert_shared_feed_forward_length"
    config.update(
        architectures=["GraniteMoeHybridForCausalLM"],
        model_type="granitemoehybrid",
        hidden_act="silu",
        head_dim=hidden // config["num_attention_heads"],  # Granite's converter drops it
        shared_intermediate_size=file.get_int(shared, config["intermediate_size"], low=1),
        layer_types=["attention" if k else "mamba" for k in kv],
        mamba_n_heads=heads,
        mamba_d_head=inner // heads,
        mamba_d_state=file.get_int(f"{a}.ssm.state_size", low=1),
        mamba_n_groups=file.get_int(f"{a}.ssm.group_count", 1, low=1),
        mamba_d_conv=file.get_int(f"{a}.ssm.conv_kernel", low=1, high=64),
        mamba_expand=inner // hidden,
        mamba_conv_bias="blk.0.ssm_conv1d.bias" in file.tensors,
        mamba_proj_bias="blk.0.ssm_in.bias" in file.tensors,
        num_local_experts=experts,
        num_experts_per_tok=file.get_int(f"{a}.expert_used_count", 0, high=max(experts, 0)),
        position_embedding_type="rope" if _rope_on(file) else "nope",
        embedding_multiplier=file.get_float(f"{a}.embedding_scale", 1.0),
        attention_multiplier=file.get_float(f"{a}.attention.scale", config["head_dim"] ** -0.5),
        residual_multiplier=file.get_float(f"{a}.residual_scale", 1.0),
        logits_scaling=file.get_float(f"{a}.logit_scale", 1.0),
    )
    if inner % heads or inner % hidden:
        raise ModelLoadError(f"{file.path}: ssm.inner_size {inner} does not split evenly")
    return config


def _rope_on(file: GgufFile) -> bool:
    value = file.get(f"{file.architecture}.rope.scaling.finetuned", True)
    if not isinstance(value, bool):
        raise ModelLoadError(f"{file.path}: metadata 'rope.scaling.finetuned' must be a bool")
    return value


_BUILDERS: dict[str, Callable[[GgufFile], dict[str, Any]]] = {
    "qwen3": _qwen3,
    "gemma3": _gemma3,
    "granitehybrid": _granite_hybrid,
}
GGUF_ARCHS = tuple(_BUILDERS)
# what llama.cpp's converter added to these families' norm weights (the model adds it back)
NORM_SHIFT: dict[str, float] = {"gemma3": 1.0}
