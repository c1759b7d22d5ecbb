"""What llama.cpp's converter does to a Granite 4.0-H checkpoint (``granitehybrid``), redone
here for the tiny GGUF files of ``gguf_checkpoints.py``: its metadata keys and its tensor
rewrites (``model/loading/gguf/sources.py`` undoes them; this is their forward direction,
written from the converter's behaviour: ``conversion/granite.py``, ``mamba.py``, ``llama.py``).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import gguf
import numpy as np

# 2-D tensors llama-quantize keeps in float (a row of 4 conv taps, the [H, 1] A and D, the
# gated norm's [groups, d] weight, the MoE router)
FLOAT_2D = frozenset(
    {"ssm_conv1d", "ssm_norm", "ssm_a", "ssm_d", "ffn_gate_inp", "ffn_gate_inp_shexp"}
)


def write_granite_hparams(writer: gguf.GGUFWriter, config: dict[str, Any]) -> None:
    layers = config["num_hidden_layers"]
    inner = config["mamba_expand"] * config["hidden_size"]
    kv = [config["num_key_value_heads"] if t == "attention" else 0 for t in config["layer_types"]]
    writer.add_block_count(layers)
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(config["num_attention_heads"])
    writer.add_head_count_kv(kv)
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    writer.add_rope_freq_base(config["rope_theta"])
    writer.add_expert_count(config["num_local_experts"])
    writer.add_expert_used_count(config["num_experts_per_tok"])
    writer.add_attention_scale(config["attention_multiplier"])
    writer.add_embedding_scale(config["embedding_multiplier"])
    writer.add_residual_scale(config["residual_multiplier"])
    writer.add_logit_scale(config["logits_scaling"])
    writer.add_expert_shared_feed_forward_length(config["shared_intermediate_size"])
    writer.add_ssm_conv_kernel(config["mamba_d_conv"])
    writer.add_ssm_state_size(config["mamba_d_state"])
    writer.add_ssm_group_count(config["mamba_n_groups"])
    writer.add_ssm_inner_size(inner)
    writer.add_ssm_time_step_rank(config["mamba_n_heads"])
    # the real converter writes False for every hybrid (llama.cpp then runs it without RoPE);
    # True here when the checkpoint uses RoPE, so the q/k row permutation is tested
    writer.add_rope_scaling_finetuned(config["position_embedding_type"] == "rope")


def granite_tensors(
    name: str, tensor: np.ndarray, config: dict[str, Any], names: gguf.TensorNameMap
) -> Iterator[tuple[str, np.ndarray]]:
    """The GGUF tensors the converter writes for the checkpoint's ``name``."""
    head, _, leaf = name.rpartition(".")
    blk = f"blk.{name.split('.')[2]}" if name.startswith("model.layers.") else ""
    shared = "_shexp" if config.get("num_local_experts") else ""  # beside experts
    if name.endswith("input_linear.weight"):  # [.., 2I, H]: gate rows, then up rows
        gate, up = np.split(tensor, 2, axis=-2)
        suffix = "_exps" if "block_sparse_moe" in name else shared
        yield f"{blk}.ffn_gate{suffix}.weight", gate
        yield f"{blk}.ffn_up{suffix}.weight", up
        return
    if name.endswith("shared_mlp.output_linear.weight"):
        yield f"{blk}.ffn_down{shared}.weight", tensor
        return
    if leaf == "dt_bias":
        yield f"{blk}.ssm_dt.bias", tensor
        return
    theirs = names.get_name(name, try_suffixes=(".weight", ".bias"))
    assert theirs is not None, name
    yield theirs, _rewritten(name, tensor, config)


def _rewritten(name: str, tensor: np.ndarray, config: dict[str, Any]) -> np.ndarray:
    heads, kv = config["num_attention_heads"], config["num_key_value_heads"]
    if name.endswith("q_proj.weight"):
        return permute_rope_rows(tensor, heads)
    if name.endswith("k_proj.weight"):
        return permute_rope_rows(tensor, kv)
    return mamba2_rewritten(name, tensor, config["mamba_n_groups"])


def mamba2_rewritten(name: str, tensor: np.ndarray, groups: int) -> np.ndarray:
    """A Mamba2 mixer's tensor as the converter writes it (``conversion/mamba.py``); any
    other tensor as it is."""
    if name.endswith("A_log"):
        return -np.exp(tensor).reshape(-1, 1)
    if name.endswith(".D"):
        return tensor.reshape(-1, 1)
    if name.endswith("conv1d.weight"):
        return tensor.squeeze(1)
    if name.endswith(("mamba.norm.weight", "mixer.norm.weight")):
        return tensor.reshape(groups, -1)
    return tensor


def permute_rope_rows(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's q/k row order: each head's two RoPE halves interleaved."""
    return (
        w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)
    )
