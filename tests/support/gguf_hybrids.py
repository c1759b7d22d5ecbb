"""What llama.cpp's converter does to Nemotron-H and Falcon-H1 checkpoints, redone here for
the tiny GGUF files of ``gguf_checkpoints.py`` (their forward direction, written from the
converter's behaviour: ``conversion/nemotron.py``, ``falcon_h1.py``, ``mamba.py``,
``granite.py``, ``llama.py``; ``model/loading/gguf/sources.py`` undoes them).

- Nemotron-H with experts is ``nemotron_h_moe``: experts stacked ``[E, out, in]``, the router's
  correction bias ``exp_probs_b``, q/k rows permuted, Mamba2's rewrites; ``feed_forward_length``
  per layer (experts' width on MoE layers, 0 elsewhere);
- Falcon-H1: every MuP multiplier multiplied into its weights (none written), Mamba2's
  rewrites, no q/k permutation;
- Qwen3-Next and Qwen3.5: ``gguf_qwen.py``; gpt-oss: ``gguf_gpt_oss.py``.

The checkpoints: transformers-built, every projection's input a multiple of Q4_K's 256.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import gguf
import numpy as np

from tests.support.gguf_gpt_oss import (
    GPT_OSS_ARCHS,
    GPT_OSS_SIZES,
    gpt_oss_tensors,
    write_gpt_oss_hparams,
)
from tests.support.gguf_granite import mamba2_rewritten, permute_rope_rows
from tests.support.gguf_qwen import QWEN_ARCHS, QWEN_SIZES, qwen_tensors, write_qwen_hparams

HYBRID_ARCHS = {
    "nemotron_h": gguf.MODEL_ARCH.NEMOTRON_H_MOE,
    "falcon_h1": gguf.MODEL_ARCH.FALCON_H1,
    **QWEN_ARCHS,
    **GPT_OSS_ARCHS,
}
_ATTENTION = {
    "hidden_size": 256, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64,
    "intermediate_size": 256, "vocab_size": 1024, "max_position_embeddings": 4096,
    "initializer_range": 0.05, "eos_token_id": [2, 0], "pad_token_id": 0,
    "bos_token_id": None, "tie_word_embeddings": False,
}  # fmt: skip
HYBRID_SIZES: dict[str, dict[str, Any]] = {
    # Mamba2 (2 groups), MoE (4 experts in 2 groups, top-2, shared expert), attention (no
    # RoPE), MLP (relu2), Mamba2; chunk 128 as the loader's default (not in the file)
    "nemotron_h": {
        **_ATTENTION, "hybrid_override_pattern": "ME*M-M", "mamba_num_heads": 8,
        "mamba_head_dim": 32, "ssm_state_size": 16, "n_groups": 2, "chunk_size": 128,
        "n_routed_experts": 4, "moe_intermediate_size": 256,
        "moe_shared_expert_intermediate_size": 256, "num_experts_per_tok": 2, "n_group": 2,
        "topk_group": 1, "routed_scaling_factor": 1.5, "layer_norm_epsilon": 1e-5,
    },
    # 3 layers of Mamba2 (8 heads of 32, 2 groups, gated norm after the gate: llama.cpp's
    # order) beside attention; every multiplier set (the converter folds them)
    "falcon_h1": {
        **_ATTENTION, "num_hidden_layers": 3, "mamba_d_ssm": 256, "mamba_n_heads": 8,
        "mamba_d_head": 32, "mamba_d_state": 16, "mamba_n_groups": 2, "mamba_chunk_size": 256,
        "mamba_rms_norm": True, "mamba_norm_before_gate": False, "rms_norm_eps": 1e-5,
        "embedding_multiplier": 2.0, "lm_head_multiplier": 0.5, "mlp_multipliers": [1.2, 0.8],
        "key_multiplier": 0.7, "attention_in_multiplier": 0.9, "attention_out_multiplier": 1.1,
        "ssm_multipliers": [1.1, 0.9, 1.2, 0.8, 1.3], "ssm_in_multiplier": 1.05,
        "ssm_out_multiplier": 0.95,
    },
    **QWEN_SIZES,
    **GPT_OSS_SIZES,
}  # fmt: skip


# MoE routers scaled up: a trained router picks its experts decisively, a random one ties
# often, and a tie that a weight's rounding flips moves the logits far more than the rounding
# itself (Qwen3-Next's Q8_0 file, every layer MoE, initializer_range 0.05: mean |delta
# logprob| 0.175 with random routers, 0.076 with these)
ROUTERS = ("mlp.gate.weight", "mixer.gate.weight", "mlp.router.weight")
ROUTER_SHARPNESS = 8.0


def make_hybrid_hf_checkpoint(arch: str, out_dir: Path, seed: int = 0) -> Path:
    """The transformers checkpoint ``make_gguf_checkpoint`` converts."""
    import json

    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from hybridkv.model.loading.tiny_tokenizer import write_tokenizer

    sizes = dict(HYBRID_SIZES[arch])
    config = AutoConfig.for_model(sizes.pop("model_type", arch), **sizes)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith(ROUTERS):
                param.mul_(ROUTER_SHARPNESS)
    model.save_pretrained(out_dir)
    write_tokenizer(out_dir, 1024)
    (out_dir / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 0]}))
    return out_dir


def write_hybrid_hparams(writer: gguf.GGUFWriter, arch: str, config: dict[str, Any]) -> None:
    if arch in QWEN_ARCHS:
        write_qwen_hparams(writer, arch, config)
        return
    if arch in GPT_OSS_ARCHS:
        write_gpt_oss_hparams(writer, config)
        return
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_head_count(config["num_attention_heads"])
    writer.add_key_length(config["head_dim"])
    writer.add_value_length(config["head_dim"])
    writer.add_ssm_conv_kernel(4)
    if arch == "falcon_h1":
        _falcon_hparams(writer, config)
    else:
        _nemotron_hparams(writer, config)


def _falcon_hparams(writer: gguf.GGUFWriter, config: dict[str, Any]) -> None:
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count_kv(config["num_key_value_heads"])
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    writer.add_rope_freq_base(10000.0)
    writer.add_ssm_inner_size(config["mamba_d_ssm"])
    writer.add_ssm_state_size(config["mamba_d_state"])
    writer.add_ssm_time_step_rank(config["mamba_n_heads"])
    writer.add_ssm_group_count(config["mamba_n_groups"])


def _nemotron_hparams(writer: gguf.GGUFWriter, config: dict[str, Any]) -> None:
    pattern = config["hybrid_override_pattern"]
    kv, moe = config["num_key_value_heads"], config["moe_intermediate_size"]
    writer.add_block_count(len(pattern))
    writer.add_feed_forward_length([moe if c == "E" else 0 for c in pattern])
    writer.add_head_count_kv([kv if c == "*" else 0 for c in pattern])
    writer.add_layer_norm_rms_eps(1e-6)  # the converter's rms_norm_eps (the model reads the other)
    writer.add_layer_norm_eps(config["layer_norm_epsilon"])
    writer.add_ssm_inner_size(config["mamba_num_heads"] * config["mamba_head_dim"])
    writer.add_ssm_state_size(config["ssm_state_size"])
    writer.add_ssm_time_step_rank(config["mamba_num_heads"])
    writer.add_ssm_group_count(config["n_groups"])
    writer.add_rope_scaling_finetuned(False)
    writer.add_expert_count(config["n_routed_experts"])
    writer.add_expert_used_count(config["num_experts_per_tok"])
    writer.add_expert_feed_forward_length(moe)
    writer.add_expert_shared_feed_forward_length(config["moe_shared_expert_intermediate_size"])
    writer.add_expert_shared_count(1)
    writer.add_expert_weights_norm(True)
    writer.add_expert_weights_scale(config["routed_scaling_factor"])
    writer.add_expert_group_count(config["n_group"])
    writer.add_expert_group_used_count(config["topk_group"])


def hybrid_tensors(
    arch: str, tensors: dict[str, np.ndarray], config: dict[str, Any], names: gguf.TensorNameMap
) -> Iterator[tuple[str, np.ndarray]]:
    """The GGUF tensors the converter writes for the checkpoint's ``tensors``."""
    if arch in QWEN_ARCHS:
        yield from qwen_tensors(arch, tensors, config, names)
        return
    if arch in GPT_OSS_ARCHS:
        yield from gpt_oss_tensors(arch, tensors, names)
        return
    experts: dict[str, list[np.ndarray]] = {}
    for name, tensor in sorted(tensors.items()):
        if ".mixer.experts." in name:  # backbone.layers.B.mixer.experts.X.up_proj.weight
            parts = name.split(".")
            experts.setdefault(f"blk.{parts[2]}.ffn_{parts[6][:-5]}_exps.weight", []).append(tensor)
            continue
        theirs = _name(name, names)
        if arch == "falcon_h1":
            tensor = falcon_folded(name, tensor, config)
        elif name.endswith(("q_proj.weight", "k_proj.weight")):
            heads = config["num_attention_heads" if "q_proj" in name else "num_key_value_heads"]
            tensor = permute_rope_rows(tensor, heads)
        groups = config.get("n_groups", config.get("mamba_n_groups"))
        yield theirs, mamba2_rewritten(name, tensor, groups)
    for theirs, stack in sorted(experts.items()):  # X in 0..E-1: sorted as text, E <= 10
        yield theirs, np.stack(stack)


def _name(name: str, names: gguf.TensorNameMap) -> str:
    if name.endswith("dt_bias"):
        return f"blk.{name.split('.')[2]}.ssm_dt.bias"
    if name.endswith("e_score_correction_bias"):
        return f"blk.{name.split('.')[2]}.exp_probs_b.bias"
    theirs = names.get_name(name, try_suffixes=(".weight", ".bias"))
    assert theirs is not None, name
    return theirs


def falcon_folded(name: str, tensor: np.ndarray, config: dict[str, Any]) -> np.ndarray:
    """``tensor`` with the multipliers the converter multiplies into it."""
    attn_in = config["attention_in_multiplier"]
    scale = {
        "down_proj": config["mlp_multipliers"][1],
        "gate_proj": config["mlp_multipliers"][0],
        "k_proj": config["key_multiplier"] * attn_in,
        "q_proj": attn_in,
        "v_proj": attn_in,
        "o_proj": config["attention_out_multiplier"],
        "out_proj": config["ssm_out_multiplier"],
        "lm_head": config["lm_head_multiplier"],
        "embed_tokens": config["embedding_multiplier"],
    }
    for part, factor in scale.items():
        if part in name:
            return tensor * np.float32(factor)
    if "in_proj" not in name:
        return tensor
    inner, span = config["mamba_d_ssm"], config["mamba_n_groups"] * config["mamba_d_state"]
    sizes = [inner, inner, span, span, config["mamba_n_heads"]]  # z, x, B, C, dt rows
    rows = np.repeat(np.asarray(config["ssm_multipliers"], np.float32), sizes)
    return tensor * np.float32(config["ssm_in_multiplier"]) * rows[:, None]
