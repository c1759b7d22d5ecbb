"""Which GGUF tensors make one of our parameters, and how the converter's change is undone.

Most parameters are one GGUF tensor as it is, named by the ``gguf`` package's
``TensorNameMap`` (the table llama.cpp's converter uses; Nemotron-H's names under its
checkpoints' ``backbone.`` prefix). The exceptions, per family, are what llama.cpp's
``convert_hf_to_gguf.py`` rewrites:

- Granite and Nemotron-H (``LlamaModel``'s converter): q/k rows permuted from the half-split
  RoPE layout to GGML's interleaved one, per head: ``rows.reshape(heads, 2, d/2).swapaxes(1,
  2)``; the inverse permutation puts them back (blocks are per row, so quantized rows move as
  they are). Nemotron-H has no RoPE, so the permutation changes no product, but it is undone
  all the same: the F32 file gives the checkpoint back;
- Granite's fused ``shared_mlp.input_linear`` (gate rows, then up rows) is split into
  ``ffn_gate`` and ``ffn_up`` (``*_shexp`` next to experts); the MoE's fused experts into
  ``ffn_gate_exps`` / ``ffn_up_exps``: concatenated back along the rows;
- Nemotron-H's experts, one tensor each in the checkpoint, are stacked into ``*_exps``
  ``[E, out, in]`` (our parameter's layout); its router's correction bias is ``exp_probs_b``;
- Mamba2 (Granite, Nemotron-H, Falcon-H1): ``A_log`` written as ``A = -exp(A_log)`` of shape
  ``[H, 1]``, ``D`` as ``[H, 1]``, ``conv1d.weight`` ``[C, 1, K]`` squeezed to ``[C, K]``, the
  gated norm ``[d_inner]`` as ``[groups, d_inner / groups]``, ``dt_bias`` renamed
  ``ssm_dt.bias``;
- gpt-oss: ``sources_gpt_oss``;
- Falcon-H1's MuP multipliers are multiplied into the weights and not written: nothing can
  undo that, so its config sets every multiplier to 1 (``config_hybrid``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from hybridkv.model.loading.gguf.file import GgufFile
from hybridkv.model.loading.gguf.rewrites import GgufSource, Rule, a_log, conv, flat, one
from hybridkv.model.loading.gguf.sources_gdn import GDN_RULES
from hybridkv.model.loading.gguf.sources_gpt_oss import GPT_OSS_RULES

if TYPE_CHECKING:
    import gguf


def gguf_source(file: GgufFile, name: str, names: gguf.TensorNameMap) -> GgufSource:
    """The GGUF tensors of our parameter ``name`` (a Hugging Face name); ``names``: the
    architecture's ``TensorNameMap``."""
    parts = name.split(".")
    if len(parts) >= 5 and parts[:2] == ["model", "layers"]:
        blk, leaf = f"blk.{parts[2]}", ".".join(parts[3:])
        rule = _RULES.get(file.architecture, {}).get(leaf)
        if rule is not None:
            return rule(file, blk)
    prefix = _PREFIX.get(file.architecture)
    if prefix is not None and name.startswith(prefix[0]):
        name = prefix[1] + name.removeprefix(prefix[0])
    theirs = names.get_name(name, try_suffixes=(".weight", ".bias"))
    return GgufSource((theirs or f"<no GGUF name for {name}>",))


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


def _mamba2(mixer: str) -> dict[str, Rule]:
    return {
        f"{mixer}.A_log": one("ssm_a", a_log),
        f"{mixer}.D": one("ssm_d", flat),
        f"{mixer}.dt_bias": one("ssm_dt.bias"),
        f"{mixer}.conv1d.weight": one("ssm_conv1d.weight", conv),
        f"{mixer}.norm.weight": one("ssm_norm.weight", flat),
    }


def _rope_pair(attn: str) -> dict[str, Rule]:
    return {
        f"{attn}.q_proj.weight": lambda f, b: _unpermute(f, b, "attn_q", kv=False),
        f"{attn}.k_proj.weight": lambda f, b: _unpermute(f, b, "attn_k", kv=True),
    }


_GRANITE: dict[str, Rule] = {
    **_rope_pair("self_attn"),
    "shared_mlp.input_linear.weight": lambda f, b: _shared(f, b, ("ffn_gate", "ffn_up")),
    "shared_mlp.output_linear.weight": lambda f, b: _shared(f, b, ("ffn_down",)),
    "block_sparse_moe.input_linear.weight": lambda f, b: GgufSource(
        (f"{b}.ffn_gate_exps.weight", f"{b}.ffn_up_exps.weight")
    ),
    "block_sparse_moe.output_linear.weight": one("ffn_down_exps.weight"),
    "block_sparse_moe.router.layer.weight": one("ffn_gate_inp.weight"),
    **_mamba2("mamba"),
}
_NEMOTRON: dict[str, Rule] = {
    **_rope_pair("mixer"),
    "mixer.experts.up_proj": one("ffn_up_exps.weight"),
    "mixer.experts.down_proj": one("ffn_down_exps.weight"),
    "mixer.gate.e_score_correction_bias": one("exp_probs_b.bias"),
    **_mamba2("mixer"),
}
_RULES: dict[str, dict[str, Rule]] = {
    "granitehybrid": _GRANITE,
    "nemotron_h": _NEMOTRON,
    "nemotron_h_moe": _NEMOTRON,
    "falcon-h1": _mamba2("mamba"),
    **GDN_RULES,
    "gpt-oss": GPT_OSS_RULES,
}
# our parameter names' prefix -> the checkpoints' (what ``TensorNameMap`` knows)
_PREFIX = {"nemotron_h": ("model.", "backbone."), "nemotron_h_moe": ("model.", "backbone.")}
