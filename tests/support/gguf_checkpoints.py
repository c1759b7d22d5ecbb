"""Tiny GGUF files in the real format, written by the ``gguf`` package's writer the way
llama.cpp's converter writes them (names from ``gguf``'s ``TensorNameMap``, Gemma norms + 1,
byte-level BPE vocabulary, merges and token types, the chat template), from a tiny
transformers checkpoint (``checkpoints.make_hf_checkpoint``). Projections are packed by the
project's packer (``native/quant_blocks.py``) in the format asked for; norms stay float32,
and so does the embedding unless ``formats`` names ``token_embd``. ``GGUF_SIZES`` are the config overrides that make every projection's
input a multiple of Q4_K's 256-value blocks.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import gguf
import numpy as np
from safetensors.numpy import load_file

from hybridkv.model.loading.tiny_tokenizer import CHAT_TEMPLATE, EOS_TOKEN, PAD_TOKEN
from hybridkv.native.quant_blocks import QuantFormat, pack
from tests.support.checkpoints import hf_config_dict, make_hf_checkpoint
from tests.support.gguf_granite import FLOAT_2D, granite_tensors, write_granite_hparams
from tests.support.gguf_hybrids import (
    HYBRID_ARCHS,
    HYBRID_SIZES,
    hybrid_tensors,
    make_hybrid_hf_checkpoint,
    write_hybrid_hparams,
)

GGUF_SIZES: dict[str, dict[str, Any]] = {
    "qwen3": {
        "hidden_size": 256, "intermediate_size": 512, "head_dim": 64, "num_hidden_layers": 2,
        "use_sliding_window": False, "layer_types": ["full_attention"] * 2,
    },
    "gemma3": {
        "hidden_size": 256, "intermediate_size": 512, "head_dim": 64, "query_pre_attn_scalar": 64,
        "final_logit_softcapping": None,
    },
    "granitemoehybrid": {  # RoPE on (see gguf_granite); Q4_K-sized d_inner and MLP
        "hidden_size": 256, "intermediate_size": 512, "shared_intermediate_size": 512,
        "num_attention_heads": 4, "num_key_value_heads": 2, "mamba_n_heads": 8,
        "mamba_d_head": 64, "attention_multiplier": 1 / 64,
        "mamba_chunk_size": 256,  # not in GGUF: the loader takes transformers' default
    },
}  # fmt: skip
# Granite 4.0-H with experts (checkpoints.py's 4 experts, top-2, no RoPE): experts in blocks
GGUF_SIZES["granitemoehybrid_moe"] = {
    **GGUF_SIZES["granitemoehybrid"], "position_embedding_type": "nope", "attention_multiplier": 1 / 64,
}  # fmt: skip
_ARCH = {
    "qwen3": gguf.MODEL_ARCH.QWEN3,
    "gemma3": gguf.MODEL_ARCH.GEMMA3,
    "granitemoehybrid": gguf.MODEL_ARCH.GRANITE_HYBRID,
    "granitemoehybrid_moe": gguf.MODEL_ARCH.GRANITE_HYBRID,
    **HYBRID_ARCHS,
}


def make_gguf_hf_checkpoint(arch: str, out_dir: Path) -> Path:
    """The transformers checkpoint ``make_gguf_checkpoint`` converts."""
    if arch in HYBRID_ARCHS:
        return make_hybrid_hf_checkpoint(arch, out_dir)
    return make_hf_checkpoint(arch, out_dir, **GGUF_SIZES[arch])


def make_gguf_checkpoint(
    arch: str,
    hf_dir: Path,
    path: Path,
    formats: dict[str, QuantFormat],
    edit: Callable[[str, np.ndarray], np.ndarray | None] | None = None,
) -> Path:
    """``path``: the tiny ``arch`` model at ``hf_dir`` (``make_gguf_hf_checkpoint``) as GGUF,
    each projection whose GGUF name contains a key of ``formats`` packed in that format
    (``{"": fmt}``: every one); ``edit(name, values)`` (hostile files) changes a converted
    tensor, or drops it (None)."""
    hybrid = arch in HYBRID_ARCHS
    # legacy key names (rope_theta)
    config = HYBRID_SIZES[arch] if hybrid else hf_config_dict(arch, **GGUF_SIZES[arch])
    writer = gguf.GGUFWriter(str(path), gguf.MODEL_ARCH_NAMES[_ARCH[arch]])
    _write_hparams(writer, arch, config)
    _write_tokenizer(writer, hf_dir)
    layers = len(config.get("hybrid_override_pattern", "")) or config["num_hidden_layers"]
    names = gguf.get_tensor_name_map(_ARCH[arch], layers)
    tensors = load_file(str(hf_dir / "model.safetensors"))
    if hybrid:
        converted = hybrid_tensors(arch, tensors, config, names)
    else:
        converted = (
            c for n, t in sorted(tensors.items()) for c in _converted(arch, n, t, config, names)
        )
    for theirs, values in converted:
        edited = values if edit is None else edit(theirs, values)
        if edited is not None:
            _add_tensor(writer, arch, theirs, edited, formats)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _converted(
    arch: str, name: str, tensor: np.ndarray, config: dict[str, Any], names: gguf.TensorNameMap
) -> Iterator[tuple[str, np.ndarray]]:
    if arch.startswith("granitemoehybrid"):
        yield from granite_tensors(name, tensor, config, names)
        return
    theirs = names.get_name(name, try_suffixes=(".weight", ".bias"))
    assert theirs is not None, name
    yield theirs, tensor


def _add_tensor(
    writer: gguf.GGUFWriter,
    arch: str,
    theirs: str,
    tensor: np.ndarray,
    formats: dict[str, QuantFormat],
) -> None:
    fmt = next((f for key, f in formats.items() if key in theirs), None)
    embedding = "token_embd" in theirs  # quantized only when named: {"token_embd": fmt}
    if tensor.dtype == np.uint8:  # already in blocks (gpt-oss's MXFP4 experts)
        writer.add_tensor(theirs, tensor, raw_dtype=gguf.GGMLQuantizationType.MXFP4)
        return
    kind = theirs.removesuffix(".weight").split(".")[-1]  # blk.0.ssm_a -> ssm_a
    packed = tensor.ndim in (2, 3) and kind not in FLOAT_2D and not theirs.endswith(".bias")
    if packed and fmt is not None and (not embedding or "token_embd" in formats):
        raw = gguf.GGMLQuantizationType(fmt.layout.ggml_type)
        rows = pack(np.ascontiguousarray(tensor.reshape(-1, tensor.shape[-1])), fmt)
        writer.add_tensor(theirs, rows.reshape(*tensor.shape[:-1], -1), raw_dtype=raw)
    else:
        shift = 1.0 if arch == "gemma3" and theirs.endswith("norm.weight") else 0.0
        writer.add_tensor(theirs, np.ascontiguousarray(tensor + shift, dtype=np.float32))


def _write_hparams(writer: gguf.GGUFWriter, arch: str, config: dict[str, Any]) -> None:
    if arch.startswith("granitemoehybrid"):
        write_granite_hparams(writer, config)
        return
    if arch in HYBRID_ARCHS:
        write_hybrid_hparams(writer, arch, config)
        return
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(config["num_attention_heads"])
    writer.add_head_count_kv(config["num_key_value_heads"])
    writer.add_key_length(config["head_dim"])
    writer.add_value_length(config["head_dim"])
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    writer.add_rope_freq_base(config["rope_theta"])
    if arch == "gemma3":
        writer.add_sliding_window(config["sliding_window"])


def _write_tokenizer(writer: gguf.GGUFWriter, hf_dir: Path) -> None:
    tok = json.loads((hf_dir / "tokenizer.json").read_text())
    vocab: dict[str, int] = tok["model"]["vocab"]
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    special = {a["content"] for a in tok["added_tokens"] if a["special"]}
    merges = [m if isinstance(m, str) else " ".join(m) for m in tok["model"]["merges"]]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("gpt-2")
    writer.add_token_list(tokens)
    writer.add_token_types([3 if t in special else 1 for t in tokens])
    writer.add_token_merges(merges)
    writer.add_eos_token_id(vocab[EOS_TOKEN])
    writer.add_pad_token_id(vocab[PAD_TOKEN])
    writer.add_chat_template(CHAT_TEMPLATE)
