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
from hybridkv.model.loading.gguf_file import GgufFile

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
        "num_key_value_heads": file.get_int(f"{a}.attention.head_count_kv", heads, low=1),
        "head_dim": file.get_int(f"{a}.attention.key_length", hidden // heads, low=1),
        "max_position_embeddings": file.get_int(f"{a}.context_length", 4096, low=1),
        "rms_norm_eps": file.get_float(f"{a}.attention.layer_norm_rms_epsilon", 1e-6),
        "rope_theta": file.get_float(f"{a}.rope.freq_base", 10000.0),
        "tie_word_embeddings": "output.weight" not in file.tensors,
        "torch_dtype": "float32",
        **_special_ids(file, embed.shape[0]),
    }


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


_BUILDERS: dict[str, Callable[[GgufFile], dict[str, Any]]] = {"qwen3": _qwen3, "gemma3": _gemma3}
GGUF_ARCHS = tuple(_BUILDERS)
# what llama.cpp's converter added to these families' norm weights (the model adds it back)
NORM_SHIFT: dict[str, float] = {"gemma3": 1.0}
