"""Tiny checkpoints in the Hub's quantized layouts, from float32 ones built with transformers:

- ``make_mxfp4_checkpoint(original, out)``: gpt-oss with its MoE experts in MXFP4 as the real
  checkpoints store them (``*_blocks [E, out, in/32, 16]``, ``*_scales [E, out, in/32]``, the
  weights transposed from transformers' ``[E, in, out]``; ``quantization_config: {quant_method:
  mxfp4, modules_to_not_convert: [...]}``);
- ``make_fp8_checkpoint(original, out, block)``: every projection's ``weight`` float8_e4m3fn
  with a float32 ``weight_scale_inv`` per block (``quant_method: fp8``, dynamic activations);
  embeddings, norms, routers and ``lm_head`` as they were.

Each also writes ``<out>-dequantized``: the same checkpoint in float32 with every quantized
weight replaced by its dequantized values (the quality gate's reference: the same weights
through the float32 path). ``gpt_oss_original(out)``: the float32 gpt-oss to start from
(intermediate size 64: MXFP4 blocks need multiples of 32).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from hybridkv.model.loading.make_model import model_config_json
from hybridkv.model.loading.tiny_tokenizer import write_tokenizer
from tests.support.families import _BUILDERS
from tests.support.hub_pack import pack_fp8, pack_mxfp4, unit_of

WEIGHTS = "model.safetensors"
MXFP4_NOT_CONVERTED = ["model.layers.*.self_attn", "model.layers.*.mlp.router", "lm_head"]
FP8_NOT_CONVERTED = ["lm_head", "model.embed_tokens", "mlp.gate", "shared_expert_gate"]
Tensors = dict[str, torch.Tensor]


def gpt_oss_original(out_dir: Path, seed: int = 0) -> Path:
    """A float32 gpt-oss (4 layers, 5 experts top-2, hidden 64, intermediate 64)."""
    from transformers import AutoModelForCausalLM

    config = _BUILDERS["gpt_oss"]()  # the families' tiny gpt-oss ...
    config.intermediate_size = 64  # ... with MXFP4-sized experts
    torch.manual_seed(seed)
    AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(out_dir)
    write_tokenizer(out_dir, 1024)
    eos = model_config_json("qwen3", "tiny")["eos_token_id"]
    (out_dir / "generation_config.json").write_text(json.dumps({"eos_token_id": eos}))
    return out_dir


def make_mxfp4_checkpoint(original: Path, out_dir: Path) -> tuple[Path, Path]:
    """(the MXFP4 checkpoint, its dequantized float32 twin) of gpt-oss ``original``."""

    def convert(name: str, tensor: torch.Tensor, quant: Tensors, ref: Tensors) -> None:
        if not name.endswith(("experts.gate_up_proj", "experts.down_proj")):
            quant[name] = ref[name] = tensor
            return
        blocks, scales = pack_mxfp4(tensor.transpose(1, 2))  # [E, out, in] rows
        quant[name + "_blocks"], quant[name + "_scales"] = blocks, scales
        values = blocks_to_float(blocks, scales)  # [E, out, in]
        ref[name] = values.transpose(1, 2).contiguous()

    spec = {"quant_method": "mxfp4", "modules_to_not_convert": MXFP4_NOT_CONVERTED}
    return _write_pair(original, out_dir, spec, convert)


def make_fp8_checkpoint(original: Path, out_dir: Path, block: tuple[int, int]) -> tuple[Path, Path]:
    """(the FP8 checkpoint, its dequantized float32 twin) of ``original``."""

    def convert(name: str, tensor: torch.Tensor, quant: Tensors, ref: Tensors) -> None:
        if tensor.dim() != 2 or not name.endswith(".weight") or _fp8_excluded(name):
            quant[name] = ref[name] = tensor
            return
        fp8, scale = pack_fp8(tensor, block)
        quant[name], quant[name + "_scale_inv"] = fp8, scale
        ref[name] = fp8.float() * _expand(scale, block, tensor.shape)

    spec = {
        "quant_method": "fp8",
        "activation_scheme": "dynamic",
        "fmt": "e4m3",
        "weight_block_size": list(block),
        "modules_to_not_convert": FP8_NOT_CONVERTED,
    }
    return _write_pair(original, out_dir, spec, convert)


def blocks_to_float(blocks: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """The packer's own dequantizer (independent of ``native/mxfp4.py``'s): ``[..., K]``."""
    table = torch.tensor([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6])
    low, high = table[(blocks & 15).long()], table[(blocks >> 4).long()]  # [..., G, 16]
    values = torch.stack((low, high), -1).flatten(-2) * unit_of(scales)[..., None]
    return values.flatten(-2)


def _fp8_excluded(name: str) -> bool:
    module = name.removesuffix(".weight")
    return any(module == p or module.endswith("." + p) for p in FP8_NOT_CONVERTED)


def _expand(scale: torch.Tensor, block: tuple[int, int], shape: torch.Size) -> torch.Tensor:
    ones = torch.ones(block)
    return torch.kron(scale, ones)[: shape[0], : shape[1]]


def _write_pair(
    original: Path,
    out_dir: Path,
    spec: dict[str, Any],
    convert: Callable[[str, torch.Tensor, Tensors, Tensors], None],
) -> tuple[Path, Path]:
    quant: Tensors = {}
    ref: Tensors = {}
    for name, tensor in load_file(str(original / WEIGHTS)).items():
        convert(name, tensor, quant, ref)
    twin = out_dir.with_name(out_dir.name + "-dequantized")
    for folder, tensors in ((out_dir, quant), (twin, ref)):
        shutil.copytree(original, folder)
        save_file(tensors, str(folder / WEIGHTS), metadata={"format": "pt"})
    config = json.loads((original / "config.json").read_text())
    config["quantization_config"] = spec
    (out_dir / "config.json").write_text(json.dumps(config, indent=2))
    return out_dir, twin
