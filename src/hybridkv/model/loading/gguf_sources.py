"""Which GGUF tensors make one of our parameters, and how the converter's change is undone.

Most parameters are one GGUF tensor as it is, named by the ``gguf`` package's
``TensorNameMap``; ``gguf_source`` returns None for those. The exceptions, per family, are
what llama.cpp's ``convert_hf_to_gguf.py`` rewrites:

- Granite (``LlamaModel``'s converter): q/k rows permuted from the half-split RoPE layout to
  GGML's interleaved one, per head: ``rows.reshape(heads, 2, d/2).swapaxes(1, 2)``; the
  inverse permutation puts them back (blocks are per row, so quantized rows move as they are);
- Granite's fused ``shared_mlp.input_linear`` (gate rows, then up rows) is split into
  ``ffn_gate`` and ``ffn_up`` (``*_shexp`` next to experts); the MoE's fused experts into
  ``ffn_gate_exps`` / ``ffn_up_exps``: concatenated back along the rows;
- Mamba2: ``A_log`` written as ``A = -exp(A_log)`` of shape ``[H, 1]``, ``D`` as ``[H, 1]``,
  ``conv1d.weight`` ``[C, 1, K]`` squeezed to ``[C, K]``, the gated norm ``[d_inner]`` as
  ``[groups, d_inner / groups]``, ``dt_bias`` renamed ``ssm_dt.bias``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from hybridkv.model.loading.gguf_file import GgufFile

Undo = Callable[[torch.Tensor], torch.Tensor]


@dataclass(frozen=True, slots=True)
class GgufSource:
    """``names``: GGUF tensors concatenated along their rows (axis -2 of a weight);
    ``rows``: a row order applied after (block rows move whole); ``undo``: on float values
    last, the inverse of the converter's value change (reshape, ``-exp``)."""

    names: tuple[str, ...]
    rows: np.ndarray | None = None
    undo: Undo | None = None


def gguf_source(file: GgufFile, name: str) -> GgufSource | None:
    """The GGUF tensors of our parameter ``name`` (a Hugging Face name) when they are not
    ``TensorNameMap``'s one tensor as it is; None otherwise."""
    if file.architecture != "granitehybrid":
        return None
    parts = name.split(".")
    if len(parts) < 5 or parts[:2] != ["model", "layers"]:
        return None
    blk, leaf = f"blk.{parts[2]}", ".".join(parts[3:])
    rule = _GRANITE.get(leaf)
    return rule(file, blk) if rule is not None else None


def _shared(file: GgufFile, blk: str, names: tuple[str, ...]) -> GgufSource:
    """Dense Granite writes the shared MLP as the plain FFN, with experts as ``*_shexp``."""
    dense = f"{blk}.{names[0]}.weight" in file.tensors
    suffix = "" if dense else "_shexp"
    return GgufSource(tuple(f"{blk}.{n}{suffix}.weight" for n in names))


def _unpermute(file: GgufFile, blk: str, tensor: str, kv: bool) -> GgufSource:
    a = file.architecture
    heads = file.get_int(f"{a}.attention.head_count", low=1)
    if kv:
        layer = int(blk.removeprefix("blk."))
        per_layer = file.get(f"{a}.attention.head_count_kv")
        heads = int(per_layer[layer]) if isinstance(per_layer, list) else int(per_layer or heads)
    name = f"{blk}.{tensor}.weight"
    rows = file.tensors[name].shape[0] if name in file.tensors else 0
    return GgufSource((name,), rows=_rope_rows(rows, max(heads, 1)))


def _rope_rows(num_rows: int, heads: int) -> np.ndarray | None:
    """Row order that undoes the converter's permutation of ``num_rows`` q or k rows."""
    if num_rows == 0 or num_rows % (2 * heads):
        return None  # a wrong shape: the loader's shape check names it
    permuted = np.arange(num_rows).reshape(heads, 2, num_rows // heads // 2).swapaxes(1, 2)
    return np.argsort(permuted.reshape(-1))  # GGUF row i holds original row permuted[i]


def _a_log(a: torch.Tensor) -> torch.Tensor:
    return torch.log(-a.reshape(-1))  # A = -exp(A_log), [H, 1]


def _flat(values: torch.Tensor) -> torch.Tensor:
    return values.reshape(-1)


def _conv(values: torch.Tensor) -> torch.Tensor:
    return values.unsqueeze(1)  # [C, K] -> [C, 1, K]


def _one(tensor: str, undo: Undo | None = None) -> Callable[[GgufFile, str], GgufSource]:
    return lambda file, blk: GgufSource((f"{blk}.{tensor}",), undo=undo)


_GRANITE: dict[str, Callable[[GgufFile, str], GgufSource]] = {
    "self_attn.q_proj.weight": lambda f, b: _unpermute(f, b, "attn_q", kv=False),
    "self_attn.k_proj.weight": lambda f, b: _unpermute(f, b, "attn_k", kv=True),
    "shared_mlp.input_linear.weight": lambda f, b: _shared(f, b, ("ffn_gate", "ffn_up")),
    "shared_mlp.output_linear.weight": lambda f, b: _shared(f, b, ("ffn_down",)),
    "block_sparse_moe.input_linear.weight": lambda f, b: GgufSource(
        (f"{b}.ffn_gate_exps.weight", f"{b}.ffn_up_exps.weight")
    ),
    "block_sparse_moe.output_linear.weight": _one("ffn_down_exps.weight"),
    "block_sparse_moe.router.layer.weight": _one("ffn_gate_inp.weight"),
    "mamba.A_log": _one("ssm_a", _a_log),
    "mamba.D": _one("ssm_d", _flat),
    "mamba.dt_bias": _one("ssm_dt.bias"),
    "mamba.conv1d.weight": _one("ssm_conv1d.weight", _conv),
    "mamba.norm.weight": _one("ssm_norm.weight", _flat),
}
