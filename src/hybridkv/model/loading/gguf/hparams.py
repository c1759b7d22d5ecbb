"""The metadata every family's ``config.json`` starts from (``config``,
``config_hybrid``): sizes, norms, RoPE base, special token ids, per-layer KV heads, and
the Mamba2 mixer's ``ssm.*`` keys. Each value is read through ``GgufFile``'s typed, bounded
accessors: a forged one is a ``ModelLoadError`` naming the key."""

from __future__ import annotations

from typing import Any

from hybridkv.model.config.errors import ModelLoadError
from hybridkv.model.loading.gguf.file import MAX_DIM, GgufFile


def common_config(file: GgufFile) -> dict[str, Any]:
    """Sizes shared by every family (``intermediate_size`` is each builder's: a hybrid
    writes one per layer)."""
    a = file.architecture
    heads = file.get_int(f"{a}.attention.head_count", low=1)
    hidden = file.get_int(f"{a}.embedding_length", low=1)
    embed = file.tensors.get("token_embd.weight")
    if embed is None or len(embed.shape) != 2:
        raise ModelLoadError(f"{file.path}: no 2-D 'token_embd.weight' tensor")
    return {
        "vocab_size": embed.shape[0],
        "hidden_size": hidden,
        "num_hidden_layers": file.get_int(f"{a}.block_count", low=1, high=4096),
        "num_attention_heads": heads,
        "num_key_value_heads": max(kv_heads_per_layer(file, heads)),
        "head_dim": file.get_int(f"{a}.attention.key_length", hidden // heads, low=1),
        "max_position_embeddings": file.get_int(f"{a}.context_length", 4096, low=1),
        "rms_norm_eps": file.get_float(f"{a}.attention.layer_norm_rms_epsilon", 1e-6),
        "rope_theta": file.get_float(f"{a}.rope.freq_base", 10000.0),
        "tie_word_embeddings": "output.weight" not in file.tensors,
        "torch_dtype": "float32",
        **_special_ids(file, embed.shape[0]),
    }


def kv_heads_per_layer(file: GgufFile, heads: int) -> list[int]:
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


def mamba_sizes(file: GgufFile, hidden: int) -> tuple[int, int]:
    """``(d_inner, heads)`` of the Mamba2 mixers: ``ssm.inner_size`` and ``ssm.time_step_rank``
    (llama.cpp's name for the head count), checked to split into whole heads."""
    a = file.architecture
    inner = file.get_int(f"{a}.ssm.inner_size", low=1)
    heads = file.get_int(f"{a}.ssm.time_step_rank", low=1)
    if inner % heads:
        raise ModelLoadError(f"{file.path}: ssm.inner_size {inner} does not split into {heads}")
    return inner, heads


def ssm_int(file: GgufFile, key: str, default: int | None = None, high: int = MAX_DIM) -> int:
    """``<arch>.ssm.<key>``, at least 1."""
    return file.get_int(f"{file.architecture}.ssm.{key}", default, low=1, high=high)


def get_bool(file: GgufFile, key: str, default: bool) -> bool:
    value = file.get(key, default)
    if not isinstance(value, bool):
        raise ModelLoadError(f"{file.path}: metadata {key!r} must be a bool")
    return value
