"""The Hub's quantized weight formats, packed from float weights (the tests' own packer):

- ``pack_mxfp4``: gpt-oss's MXFP4 (``*_blocks`` / ``*_scales``, ``native/mxfp4.py`` has the
  layout): per block of 32 values the smallest power-of-two scale that fits its largest
  magnitude into e2m1's 6, every value rounded to the nearest e2m1 value;
- ``pack_fp8``: the fine-grained FP8 of ``quant_method: fp8`` checkpoints: ``weight``
  float8_e4m3fn, ``weight_scale_inv`` float32 ``[ceil(out / b0), ceil(in / b1)]`` with
  ``w = weight * weight_scale_inv`` blockwise; each block's scale maps its largest magnitude to
  e4m3's 448.
"""

from __future__ import annotations

import torch

from hybridkv.native.mxfp4 import BLOCK_BYTES, BLOCK_VALUES, E2M1

E4M3_MAX = 448.0
_E2M1_POSITIVE = torch.tensor(E2M1[:8])


def pack_mxfp4(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``weight [..., K]`` (K a multiple of 32) -> ``blocks [..., K/32, 16]``, ``scales
    [..., K/32]`` (uint8)."""
    groups = weight.float().unflatten(-1, (-1, BLOCK_VALUES))  # [..., G, 32]
    amax = groups.abs().amax(-1)  # [..., G]
    exponent = torch.ceil(torch.log2(amax.clamp(min=2.0**-126) / 6.0))  # amax / 2^e <= 6
    scales = (exponent + 127).clamp(0, 252).to(torch.uint8)
    scaled = groups / unit_of(scales)[..., None]
    nearest = (scaled.abs()[..., None] - _E2M1_POSITIVE).abs().argmin(-1)  # [..., G, 32]
    codes = (nearest + 8 * (scaled < 0)).to(torch.uint8)
    pairs = codes.unflatten(-1, (BLOCK_BYTES, 2))  # value 2i low nibble, 2i + 1 high
    blocks = pairs[..., 0] | (pairs[..., 1] << 4)
    return blocks.contiguous(), scales.contiguous()


def unit_of(scales: torch.Tensor) -> torch.Tensor:
    """``2^(scale - 127)`` of e8m0 ``scales`` (float32, exact)."""
    exponents = scales.to(torch.int32) - 127
    return torch.ldexp(torch.ones(exponents.shape), exponents)


def pack_fp8(weight: torch.Tensor, block: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
    """``weight [out, in]`` -> (float8_e4m3fn ``[out, in]``, float32 ``weight_scale_inv``)."""
    out_dim, in_dim = weight.shape
    b0, b1 = block
    rows, cols = -(-out_dim // b0), -(-in_dim // b1)
    padded = torch.zeros(rows * b0, cols * b1)
    padded[:out_dim, :in_dim] = weight.float()
    tiles = padded.view(rows, b0, cols, b1)
    scale = (tiles.abs().amax(dim=(1, 3)) / E4M3_MAX).clamp(min=1e-12)  # [rows, cols]
    q = (tiles / scale[:, None, :, None]).clamp(-E4M3_MAX, E4M3_MAX)
    fp8 = q.view(rows * b0, cols * b1)[:out_dim, :in_dim].to(torch.float8_e4m3fn)
    return fp8.contiguous(), scale
