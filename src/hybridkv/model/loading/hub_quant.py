"""The Hub's quantized safetensors checkpoints: ``config.json``'s ``quantization_config`` parsed
once into a typed, checked value, and the quantized tensors read under it.

- ``quant_method: mxfp4`` (gpt-oss): the MoE experts are ``*_blocks`` / ``*_scales`` uint8
  tensors (``native/mxfp4.py`` has the layout). The model keeps them as they are
  (``models/gpt_oss.py``'s ``Mxfp4Experts``) and multiplies on ``native/mxfp4.c``; scales that
  would make a weight NaN or overflow are refused here, at load.
- ``quant_method: fp8`` (fine-grained FP8: Qwen3-FP8, Qwen3-Next-FP8...): a ``weight`` is
  float8_e4m3fn with a float32 ``weight_scale_inv`` per ``weight_block_size`` block
  (``[ceil(out / b0), ceil(in / b1)]``; ``w = weight * scale`` blockwise). There is no float8
  kernel: each weight is dequantized when it is read (``dequantizing_index``) to the model's
  dtype, which one log line says. The scale's shape and dtype are checked against the weight it
  scales; NaN, infinite or negative scales, and NaN weights, are refused.

Any other ``quantization_config`` (another method, ``activation_scheme: static``, an unknown
key, a bad block size) is a ``ModelLoadError`` naming the field: nothing loads silently wrong.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import torch

from hybridkv.model.config.errors import ModelLoadError
from hybridkv.model.config.quant_config import FIELD, HubQuant
from hybridkv.native.mxfp4 import check_scales

log = logging.getLogger(__name__)

SCALE_SUFFIX = "_scale_inv"


def as_parameter(
    name: str, tensor: torch.Tensor, target: torch.dtype, expected: torch.dtype
) -> torch.Tensor:
    """A checkpoint tensor as the parameter ``name`` the model declared as ``expected``: MXFP4
    blocks and scales (``uint8``) as they are, scales checked; floats in ``target``; any other
    pairing refused."""
    if expected == torch.uint8:
        if tensor.dtype != torch.uint8:
            raise ModelLoadError(f"weight {name!r} is {tensor.dtype}, expected uint8 (MXFP4)")
        if name.endswith("_scales"):
            try:
                check_scales(tensor)
            except ValueError as exc:
                raise ModelLoadError(f"weight {name!r}: {exc}") from None
        return tensor
    if not tensor.is_floating_point() or tensor.dtype.itemsize == 1:
        raise ModelLoadError(
            f"weight {name!r} is {tensor.dtype}: float8 needs {FIELD}.quant_method fp8, other "
            "dtypes are not weights this model reads"
        )
    return tensor.to(target)


class _Fp8Handle:
    """A safetensors handle whose float8 weights read back dequantized to float32."""

    def __init__(self, index: Mapping[str, Any], block: tuple[int, int]) -> None:
        self.index, self.block = index, block

    def get_tensor(self, name: str) -> torch.Tensor:
        tensor: torch.Tensor = self.index[name].get_tensor(name)
        scale_name = name + SCALE_SUFFIX
        if tensor.dtype != torch.float8_e4m3fn:
            if scale_name in self.index:
                raise ModelLoadError(f"{scale_name!r} scales {name!r}, which is {tensor.dtype}")
            return tensor
        if scale_name not in self.index:
            raise ModelLoadError(f"float8 weight {name!r} has no {scale_name!r}")
        scale = self.index[scale_name].get_tensor(scale_name)
        return dequantize_fp8(name, tensor, scale, self.block)


def dequantizing_index(index: dict[str, Any], quant: HubQuant | None) -> dict[str, Any]:
    """``index`` (tensor name -> safetensors handle) with, under ``quant_method: fp8``, every
    tensor read through a handle that dequantizes float8 weights."""
    if quant is None or quant.block is None:
        return index
    log.info(
        "fp8 checkpoint: float8 weights (blocks of %dx%d) are dequantized when loaded; "
        "no float8 kernel",
        *quant.block,
    )
    handle = _Fp8Handle(index, quant.block)
    return dict.fromkeys(index, handle)


def dequantize_fp8(
    name: str, weight: torch.Tensor, scale: torch.Tensor, block: tuple[int, int]
) -> torch.Tensor:
    """float32 ``weight * scale`` blockwise; ``ModelLoadError`` naming ``name`` for a scale
    of another shape or dtype, a NaN, infinite or negative scale, or a NaN weight."""
    if weight.dim() != 2:
        raise ModelLoadError(f"float8 weight {name!r} has {weight.dim()} dims, expected 2")
    rows, cols = weight.shape
    expected = (-(-rows // block[0]), -(-cols // block[1]))
    if scale.dtype not in (torch.float32, torch.bfloat16) or tuple(scale.shape) != expected:
        raise ModelLoadError(
            f"{name + SCALE_SUFFIX!r} is {scale.dtype}{list(scale.shape)}; a float32 "
            f"{list(expected)} (blocks of {block[0]}x{block[1]}) scales {name!r}"
        )
    scale = scale.float()
    if not bool(torch.isfinite(scale).all()) or bool((scale < 0).any()):
        raise ModelLoadError(f"{name + SCALE_SUFFIX!r} holds NaN, infinite or negative scales")
    full = scale.repeat_interleave(block[0], 0)[:rows].repeat_interleave(block[1], 1)[:, :cols]
    out = weight.float() * full  # [rows, cols]
    if not bool(torch.isfinite(out).all()):
        raise ModelLoadError(f"float8 weight {name!r} holds NaN")
    return out
