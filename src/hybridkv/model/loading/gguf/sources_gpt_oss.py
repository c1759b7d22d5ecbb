"""How llama.cpp's converter rewrites gpt-oss (``conversion/gpt_oss.py``) and how each
parameter is rebuilt (``sources`` holds the other families).

- ``gate_up_proj`` (``[E, H, 2I]``, gate and up interleaved along the output) is split into
  ``ffn_gate_exps`` and ``ffn_up_exps`` ``[E, I, H]``; its bias into two ``[E, I]``. Float
  stacks: concatenated, the rows interleaved back, transposed (``in_blocks`` False: a Q8_0
  stack is dequantized, its layout being transposed from ours). ``down_proj`` likewise
  transposed.
- MXFP4 stacks (``Mxfp4Experts``, the Hub's layout ``[E, out, in/32, 16]`` + scales ``[E,
  out, in/32]``): the ggml block is 17 bytes, the e8m0 scale (the same exponent byte as the
  Hub's) then 16 bytes holding value j in byte j's low nibble and value j + 16 in its high
  one; the Hub packs values 2i and 2i + 1 into byte i. Rows move whole, then each block is
  split and its nibbles repacked once, at load (4.25 bits a weight stay 4.25).
- The attention sinks are ``attn_sinks.weight``.
"""

from __future__ import annotations

import numpy as np
import torch

from hybridkv.model.loading.gguf.file import GgufFile
from hybridkv.model.loading.gguf.rewrites import GgufSource, RawBytes, Rule, one
from hybridkv.native.mxfp4 import check_scales

MXFP4_BLOCK_BYTES = 17  # 1 scale byte + 32 4-bit values


def _interleaved(file: GgufFile, blk: str) -> np.ndarray:
    """Row order of ``[gate; up]`` that gives gate 0, up 0, gate 1, up 1, ..."""
    gate = file.tensors.get(f"{blk}.ffn_gate_exps.weight")
    inner = gate.shape[-2] if gate is not None else 0
    return np.stack([np.arange(inner), inner + np.arange(inner)], axis=1).reshape(-1)


def _transposed(values: torch.Tensor) -> torch.Tensor:
    return values.transpose(-1, -2).contiguous()  # [E, out, in] -> [E, in, out]


def _bias_interleaved(values: torch.Tensor) -> torch.Tensor:
    gate, up = values.chunk(2, dim=0)  # [2E, I] (the two biases' rows) -> [E, I] each
    return torch.stack((gate, up), dim=-1).flatten(-2)  # [E, 2I]


def _split_blocks(data: torch.Tensor) -> torch.Tensor:
    return data.reshape(*data.shape[:-1], -1, MXFP4_BLOCK_BYTES)  # [E, out, in/32, 17]


def mxfp4_scales(data: torch.Tensor) -> torch.Tensor:
    """The e8m0 scales ``[E, out, in/32]``; ValueError for a NaN (255) or overflowing one."""
    scales = _split_blocks(data)[..., 0].contiguous()
    check_scales(scales)
    return scales


def mxfp4_blocks(data: torch.Tensor) -> torch.Tensor:
    """ggml's nibbles (value j low, j + 16 high) in the Hub's order (2i low, 2i + 1 high)."""
    qs = _split_blocks(data)[..., 1:]  # [E, out, in/32, 16]
    values = torch.cat((qs & 0x0F, qs >> 4), dim=-1)  # [..., 32] codes in value order
    return (values[..., 0::2] | (values[..., 1::2] << 4)).contiguous()


def _experts(tensor: str, raw: RawBytes | None) -> Rule:
    """Float stacks (``raw`` None) transposed back; MXFP4 ones repacked by ``raw``."""

    def rule(file: GgufFile, blk: str) -> GgufSource:
        names: tuple[str, ...] = (f"{blk}.ffn_down_exps.weight",)
        rows = None
        if tensor == "gate_up":
            names = (f"{blk}.ffn_gate_exps.weight", f"{blk}.ffn_up_exps.weight")
            rows = _interleaved(file, blk)
        if raw is not None:
            return GgufSource(names, rows=rows, raw=raw)
        return GgufSource(names, rows=rows, undo=_transposed, in_blocks=False)

    return rule


GPT_OSS_RULES: dict[str, Rule] = {
    "self_attn.sinks": one("attn_sinks.weight"),
    "mlp.experts.gate_up_proj": _experts("gate_up", None),
    "mlp.experts.gate_up_proj_bias": lambda f, b: GgufSource(
        (f"{b}.ffn_gate_exps.bias", f"{b}.ffn_up_exps.bias"), undo=_bias_interleaved
    ),
    "mlp.experts.down_proj": _experts("down", None),
    "mlp.experts.down_proj_bias": one("ffn_down_exps.bias"),
    "mlp.experts.gate_up_proj_blocks": _experts("gate_up", mxfp4_blocks),
    "mlp.experts.gate_up_proj_scales": _experts("gate_up", mxfp4_scales),
    "mlp.experts.down_proj_blocks": _experts("down", mxfp4_blocks),
    "mlp.experts.down_proj_scales": _experts("down", mxfp4_scales),
}
