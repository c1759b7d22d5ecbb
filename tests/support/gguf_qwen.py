"""What llama.cpp's converter does to Qwen3-Next and Qwen3.5 checkpoints (``conversion/qwen.py``:
``Qwen3NextModel``, ``_LinearAttentionVReorderBase``), redone for the tiny GGUF files of
``gguf_checkpoints.py``; ``model/loading/gguf/sources_gdn.py`` undoes it.

Both: RMSNorm weights but the DeltaNet's output norm written ``1 + w``, ``A = -exp(A_log)``,
``conv1d`` squeezed, ``dt_bias`` as ``ssm_dt.bias``, experts stacked. Qwen3-Next: the fused
``in_proj_qkvz`` (per key head q, k, v, z) split into ``attn_qkv`` (all q, k, v) and
``attn_gate`` (all z). Qwen3.5: value heads reordered from grouped by key head to tiled
wherever they appear (2 key heads, 4 value heads here, so the order is not the identity).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import gguf
import numpy as np

# transformers' own initializer_range (0.02), not the 0.05 of the other tiny models: at 0.05
# the DeltaNet's random q/k/v make its state chaotic and Q8_0's rounding moves Qwen3-Next's
# logits 20x more (mean |delta logprob| 0.076 vs 0.004)
QWEN_ARCHS = {"qwen3_next": gguf.MODEL_ARCH.QWEN3NEXT, "qwen3_5": gguf.MODEL_ARCH.QWEN35}
_GDN = {
    "hidden_size": 256, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64,
    "intermediate_size": 256, "num_hidden_layers": 4, "linear_num_key_heads": 2,
    "linear_num_value_heads": 4, "linear_key_head_dim": 64, "linear_value_head_dim": 64,
    "vocab_size": 1024, "max_position_embeddings": 4096, "initializer_range": 0.02,
    "eos_token_id": [2, 0], "pad_token_id": 0, "bos_token_id": None,
    "tie_word_embeddings": False, "rms_norm_eps": 1e-6,
}  # fmt: skip
QWEN_SIZES: dict[str, dict[str, Any]] = {
    # MoE on every layer (llama.cpp's qwen3next has no dense layer): 4 experts, top-2, shared
    "qwen3_next": {
        **_GDN, "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 256,
        "shared_expert_intermediate_size": 256, "decoder_sparse_step": 1,
    },
    "qwen3_5": {**_GDN, "model_type": "qwen3_5_text"},
}  # fmt: skip


def write_qwen_hparams(writer: gguf.GGUFWriter, arch: str, config: dict[str, Any]) -> None:
    a, layers = writer.arch, config["num_hidden_layers"]
    nv, dv = config["linear_num_value_heads"], config["linear_value_head_dim"]
    writer.add_block_count(layers)
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(config["num_attention_heads"])
    writer.add_head_count_kv(config["num_key_value_heads"])
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    writer.add_key_length(config["head_dim"])
    writer.add_value_length(config["head_dim"])
    writer.add_ssm_conv_kernel(4)
    writer.add_ssm_state_size(config["linear_key_head_dim"])
    writer.add_ssm_group_count(config["linear_num_key_heads"])
    writer.add_ssm_time_step_rank(nv)
    writer.add_ssm_inner_size(nv * dv)
    writer.add_array(f"{a}.attention.recurrent_layers", [(i + 1) % 4 != 0 for i in range(layers)])
    writer.add_full_attention_interval(4)
    writer.add_rope_dimension_count(config["head_dim"] // 4)  # partial_rotary_factor 0.25
    if arch == "qwen3_5":
        writer.add_rope_dimension_sections([11, 11, 10, 0])
    if "num_experts" in config:
        writer.add_expert_count(config["num_experts"])
        writer.add_expert_used_count(config["num_experts_per_tok"])
        writer.add_expert_feed_forward_length(config["moe_intermediate_size"])
        writer.add_expert_shared_feed_forward_length(config["shared_expert_intermediate_size"])


def qwen_tensors(
    arch: str, tensors: dict[str, np.ndarray], config: dict[str, Any], names: gguf.TensorNameMap
) -> Iterator[tuple[str, np.ndarray]]:
    experts: dict[str, list[np.ndarray]] = {}
    for name, tensor in sorted(tensors.items()):
        if ".mlp.experts." in name:  # model.layers.B.mlp.experts.X.gate_proj.weight
            parts = name.split(".")
            stack = f"blk.{parts[2]}.ffn_{parts[6][:-5]}_exps.weight"
            experts.setdefault(stack, []).append(tensor)
            continue
        if name.endswith("in_proj_qkvz.weight"):
            yield from _split_qkvz(name, tensor, config)
            continue
        if arch == "qwen3_5" and ".linear_attn." in name:
            tensor = _tiled(name, tensor, config)
        if name.endswith("dt_bias"):
            name = name.removesuffix("dt_bias") + "dt_proj.bias"
        theirs = names.get_name(name, try_suffixes=(".weight", ".bias"))
        assert theirs is not None, name
        yield theirs, _rewritten(name, tensor)
    for theirs, stack in sorted(experts.items()):  # X in 0..E-1: sorted as text, E <= 10
        yield theirs, np.stack(stack)


def _rewritten(name: str, tensor: np.ndarray) -> np.ndarray:
    if name.endswith("A_log"):
        return -np.exp(tensor)
    if "conv1d" in name:
        return tensor.squeeze(1)
    if name.endswith("norm.weight") and not name.endswith("linear_attn.norm.weight"):
        return tensor + np.float32(1)
    return tensor


def _split_qkvz(
    name: str, w: np.ndarray, config: dict[str, Any]
) -> Iterator[tuple[str, np.ndarray]]:
    nk, dk = config["linear_num_key_heads"], config["linear_key_head_dim"]
    rdv = config["linear_num_value_heads"] // nk * config["linear_value_head_dim"]
    heads = w.reshape(nk, 2 * dk + 2 * rdv, -1)  # per key head: q, k, v, z rows
    q, k, v, z = np.split(heads, np.cumsum([dk, dk, rdv]), axis=1)
    blk = f"blk.{name.split('.')[2]}"
    flat = [part.reshape(-1, w.shape[1]) for part in (q, k, v, z)]
    yield f"{blk}.attn_qkv.weight", np.concatenate(flat[:3])
    yield f"{blk}.attn_gate.weight", flat[3]


def _tiled(name: str, tensor: np.ndarray, config: dict[str, Any]) -> np.ndarray:
    """Value heads from grouped by key head to tiled, on the axis and part that hold them."""
    nk, dk = config["linear_num_key_heads"], config["linear_key_head_dim"]
    r, dv = config["linear_num_value_heads"] // nk, config["linear_value_head_dim"]
    if name.endswith(("in_proj_qkv.weight", "conv1d.weight")):
        qk = 2 * nk * dk
        return np.concatenate([tensor[:qk], _reorder(tensor[qk:], 0, nk, r, dv)])
    if name.endswith("in_proj_z.weight"):
        return _reorder(tensor, 0, nk, r, dv)
    if name.endswith(("in_proj_a.weight", "in_proj_b.weight", "A_log", "dt_bias")):
        return _reorder(tensor, 0, nk, r, 1)
    if name.endswith("out_proj.weight"):
        return _reorder(tensor, 1, nk, r, dv)
    return tensor


def _reorder(t: np.ndarray, axis: int, nk: int, r: int, head_dim: int) -> np.ndarray:
    moved = np.moveaxis(t, axis, 0)
    heads = moved.reshape(nk, r, head_dim, *moved.shape[1:]).swapaxes(0, 1)
    return np.moveaxis(heads.reshape(moved.shape), 0, axis)
