"""What llama.cpp's converter does to a gpt-oss checkpoint (``conversion/gpt_oss.py``), redone
for the tiny GGUF files of ``gguf_checkpoints.py``; ``model/loading/gguf/sources_gpt_oss.py``
undoes it. ``gate_up_proj`` ``[E, H, 2I]`` (gate and up interleaved) becomes ``ffn_gate_exps``
and ``ffn_up_exps`` ``[E, I, H]``, its bias two ``[E, I]``; ``down_proj`` is transposed; the
sinks are ``attn_sinks.weight``. ``gpt_oss_mxfp4`` writes the three expert stacks as ggml MXFP4,
packed by the ``gguf`` package's own quantizer (as llama-quantize's MXFP4_MOE does)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import gguf
import numpy as np
from gguf import quants

# initializer_range 0.02 (transformers'), as for the Qwen files: at 0.05 Q4_K's rounding moved
# this tiny model's logits past the gate (mean |delta logprob| 0.41 vs 0.08)
GPT_OSS_ARCHS = {"gpt_oss": gguf.MODEL_ARCH.GPT_OSS, "gpt_oss_mxfp4": gguf.MODEL_ARCH.GPT_OSS}
_SIZES = {
    "model_type": "gpt_oss", "hidden_size": 256, "num_attention_heads": 4,
    "num_key_value_heads": 2, "head_dim": 64, "intermediate_size": 256,
    "num_hidden_layers": 4, "num_local_experts": 4, "num_experts_per_tok": 2,
    "sliding_window": 24, "vocab_size": 1024, "max_position_embeddings": 4096,
    "initializer_range": 0.02, "eos_token_id": [2, 0], "pad_token_id": 0,
    "bos_token_id": None, "tie_word_embeddings": False, "rms_norm_eps": 1e-5,
}  # fmt: skip
GPT_OSS_SIZES = dict.fromkeys(GPT_OSS_ARCHS, _SIZES)
_YARN = {"factor": 32.0, "original": 4096, "beta_fast": 32.0, "beta_slow": 1.0}  # transformers'


def write_gpt_oss_hparams(writer: gguf.GGUFWriter, config: dict[str, Any]) -> None:
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(config["num_attention_heads"])
    writer.add_head_count_kv(config["num_key_value_heads"])
    writer.add_rope_scaling_type(gguf.RopeScalingType.YARN)
    writer.add_rope_scaling_factor(_YARN["factor"])
    writer.add_rope_scaling_orig_ctx_len(int(_YARN["original"]))
    writer.add_rope_scaling_yarn_beta_fast(_YARN["beta_fast"])
    writer.add_rope_scaling_yarn_beta_slow(_YARN["beta_slow"])
    writer.add_rope_freq_base(150000.0)
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    writer.add_expert_count(config["num_local_experts"])
    writer.add_expert_used_count(config["num_experts_per_tok"])
    writer.add_key_length(config["head_dim"])
    writer.add_value_length(config["head_dim"])
    writer.add_sliding_window(config["sliding_window"])
    writer.add_expert_feed_forward_length(config["intermediate_size"])


def gpt_oss_tensors(
    arch: str, tensors: dict[str, np.ndarray], names: gguf.TensorNameMap
) -> Iterator[tuple[str, np.ndarray]]:
    """Float tensors, or (``gpt_oss_mxfp4``) uint8 MXFP4 bytes for the expert stacks."""
    for name, tensor in sorted(tensors.items()):
        blk = f"blk.{name.split('.')[2]}" if name.startswith("model.layers.") else ""
        if name.endswith("self_attn.sinks"):
            yield f"{blk}.attn_sinks.weight", tensor
        elif name.endswith("experts.gate_up_proj"):
            stack = tensor.swapaxes(-1, -2)  # [E, 2I, H], rows gate, up, gate, up, ...
            yield f"{blk}.ffn_gate_exps.weight", _experts(arch, stack[:, 0::2])
            yield f"{blk}.ffn_up_exps.weight", _experts(arch, stack[:, 1::2])
        elif name.endswith("experts.gate_up_proj_bias"):
            yield f"{blk}.ffn_gate_exps.bias", tensor[..., 0::2]
            yield f"{blk}.ffn_up_exps.bias", tensor[..., 1::2]
        elif name.endswith("experts.down_proj"):
            yield f"{blk}.ffn_down_exps.weight", _experts(arch, tensor.swapaxes(-1, -2))
        elif name.endswith("experts.down_proj_bias"):
            yield f"{blk}.ffn_down_exps.bias", tensor
        else:
            theirs = names.get_name(name, try_suffixes=(".weight", ".bias"))
            assert theirs is not None, name
            yield theirs, tensor


def _experts(arch: str, stack: np.ndarray) -> np.ndarray:
    stack = np.ascontiguousarray(stack)
    if arch != "gpt_oss_mxfp4":
        return stack
    return quants.quantize(stack, gguf.GGMLQuantizationType.MXFP4)  # [E, out, in/32 * 17]
