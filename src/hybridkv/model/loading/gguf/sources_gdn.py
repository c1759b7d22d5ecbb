"""How llama.cpp's converter rewrites the Gated DeltaNet families, and how each parameter is
rebuilt (``sources`` holds the other families).

Sizes, from the ``ssm.*`` metadata: ``nk`` key heads (``group_count``) of ``dk``
(``state_size``), ``nv`` value heads (``time_step_rank``) of ``dv`` (``inner_size / nv``),
``r = nv / nk`` value heads per key head.

- Qwen3-Next (``qwen3next``): the fused ``in_proj_qkvz`` holds, per key head, ``[q (dk), k
  (dk), v (r dv), z (r dv)]``; the converter writes ``attn_qkv`` = all q, all k, all v and
  ``attn_gate`` = all z. One row order over the two, concatenated, puts the rows back.
- Qwen3.5 (``qwen35``, ``qwen35moe``): separate projections, but the value heads are reordered
  from grouped by key head (``g0v0 g0v1 .. g1v0 ..``) to tiled (``g0v0 g1v0 .. g0v1 ..``)
  wherever they appear: the v rows of ``in_proj_qkv`` and the v channels of ``conv1d``, the
  rows of ``in_proj_z`` (``dv`` each) and of ``in_proj_a`` / ``in_proj_b`` (one each),
  ``A_log`` and ``dt_bias`` (one value each), and ``out_proj``'s columns. The inverse order
  undoes each (columns: block rows move whole blocks when a block lies in one head, else the
  weight is dequantized). With ``r = 1`` every order is the identity.
- Both: ``A = -exp(A_log)``; ``conv1d`` ``[C, 1, K]`` squeezed; every RMSNorm weight but the
  DeltaNet's output norm written as ``1 + w`` (``config.NORM_SHIFT``,
  ``UNSHIFTED_NORM``); experts stacked
  ``[E, out, in]``, Qwen3.5's fused ``gate_up_proj`` split into ``ffn_gate_exps`` and
  ``ffn_up_exps``; the shared expert's ``[1, H]`` gate is ``[H]`` once llama-quantize wrote it.
"""

from __future__ import annotations

import numpy as np
import torch

from hybridkv.model.config.errors import ModelLoadError
from hybridkv.model.loading.gguf.file import GgufFile
from hybridkv.model.loading.gguf.rewrites import GgufSource, Rule, a_log, conv, one


def _sizes(file: GgufFile) -> tuple[int, int, int, int]:
    """``(nk, r, dk, dv)``."""
    a = file.architecture
    nk = file.get_int(f"{a}.ssm.group_count", low=1)
    nv = file.get_int(f"{a}.ssm.time_step_rank", low=1)
    dk = file.get_int(f"{a}.ssm.state_size", low=1)
    inner = file.get_int(f"{a}.ssm.inner_size", low=1)
    if nv % nk or inner % nv:
        raise ModelLoadError(f"{file.path}: ssm sizes do not split into heads ({nk}, {nv})")
    return nk, nv // nk, dk, inner // nv


def grouped_order(nk: int, r: int, head_dim: int) -> np.ndarray:
    """Index i: the tiled position that holds grouped position i (``nk * r`` heads of
    ``head_dim``): grouped (g, j) is tiled (j, g)."""
    return np.arange(nk * r * head_dim).reshape(r, nk, head_dim).swapaxes(0, 1).reshape(-1)


def _qkvz_rows(file: GgufFile) -> np.ndarray:
    nk, r, dk, dv = _sizes(file)
    sizes = (dk, dk, r * dv, r * dv)
    bases = np.cumsum((0, nk * dk, nk * dk, nk * r * dv))  # where all q, k, v, z start
    runs = [
        np.arange(base + h * size, base + (h + 1) * size)
        for h in range(nk)
        for base, size in zip(bases, sizes, strict=True)
    ]
    return np.concatenate(runs)


def _qkv_rows(file: GgufFile) -> np.ndarray:
    nk, r, dk, dv = _sizes(file)
    return np.concatenate([np.arange(2 * nk * dk), 2 * nk * dk + grouped_order(nk, r, dv)])


def _per_head(tensor: str, head_dim: int | None) -> Rule:
    """``tensor``'s rows (heads of ``head_dim``; None: of ``dv``) put back in grouped order."""

    def rule(file: GgufFile, blk: str) -> GgufSource:
        nk, r, _, dv = _sizes(file)
        return GgufSource((f"{blk}.{tensor}",), rows=grouped_order(nk, r, head_dim or dv))

    return rule


def _per_value_head(tensor: str, log_neg: bool) -> Rule:
    """A one-per-value-head vector (``A``: ``log(-A)`` first) put back in grouped order."""

    def rule(file: GgufFile, blk: str) -> GgufSource:
        nk, r, _, _ = _sizes(file)
        order = torch.from_numpy(grouped_order(nk, r, 1))

        def undo(values: torch.Tensor) -> torch.Tensor:
            values = a_log(values) if log_neg else values.reshape(-1)
            return values.index_select(0, order) if values.numel() == order.numel() else values

        return GgufSource((f"{blk}.{tensor}",), undo=undo)

    return rule


def _out_cols(file: GgufFile, blk: str) -> GgufSource:
    nk, r, _, dv = _sizes(file)
    return GgufSource((f"{blk}.ssm_out.weight",), cols=grouped_order(nk, r, dv))


def _one_row(values: torch.Tensor) -> torch.Tensor:
    return values.reshape(1, -1)  # llama-quantize writes a [1, H] weight as [H]


_EXPERTS: dict[str, Rule] = {
    **{f"mlp.experts.{p}_proj": one(f"ffn_{p}_exps.weight") for p in ("gate", "up", "down")},
    "mlp.shared_expert_gate.weight": one("ffn_gate_inp_shexp.weight", _one_row),
}
_QWEN3_NEXT: dict[str, Rule] = {
    "linear_attn.in_proj_qkvz.weight": lambda f, b: GgufSource(
        (f"{b}.attn_qkv.weight", f"{b}.attn_gate.weight"), rows=_qkvz_rows(f)
    ),
    "linear_attn.A_log": one("ssm_a", a_log),
    "linear_attn.dt_bias": one("ssm_dt.bias"),
    "linear_attn.conv1d.weight": one("ssm_conv1d.weight", conv),
    **_EXPERTS,
}
_QWEN3_5: dict[str, Rule] = {
    "linear_attn.in_proj_qkv.weight": lambda f, b: GgufSource(
        (f"{b}.attn_qkv.weight",), rows=_qkv_rows(f)
    ),
    "linear_attn.in_proj_z.weight": _per_head("attn_gate.weight", None),
    "linear_attn.in_proj_a.weight": _per_head("ssm_alpha.weight", 1),
    "linear_attn.in_proj_b.weight": _per_head("ssm_beta.weight", 1),
    "linear_attn.A_log": _per_value_head("ssm_a", log_neg=True),
    "linear_attn.dt_bias": _per_value_head("ssm_dt.bias", log_neg=False),
    "linear_attn.conv1d.weight": lambda f, b: GgufSource(
        (f"{b}.ssm_conv1d.weight",), rows=_qkv_rows(f), undo=conv
    ),
    "linear_attn.out_proj.weight": _out_cols,
    **_EXPERTS,
}
GDN_RULES: dict[str, dict[str, Rule]] = {
    "qwen3next": _QWEN3_NEXT,
    "qwen35": _QWEN3_5,
    "qwen35moe": _QWEN3_5,
}
