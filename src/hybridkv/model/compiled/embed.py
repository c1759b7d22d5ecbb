"""The embedding lookup of a decode program: each token's row of ``model.embed_tokens``
(float32, or a ``QuantEmbedding``'s GGUF blocks dequantized by ``hk_quant_dequantize``, the
code its Python lookup runs) written into the residual rows, times the family's scale as its
``embed_input`` multiplies (Gemma 3: ``sqrt(hidden)`` rounded to float32; Granite:
``embedding_multiplier``): one ``EMBED`` op (``native/runner.c``) instead of torch ops."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from hybridkv.model.compiled.builder import ProgramBuilder, Rows, Unsupported
from hybridkv.model.layers.quant_linear import QuantEmbedding
from hybridkv.model.models.common import CausalLM
from hybridkv.model.models.gemma3 import Gemma3ForCausalLM
from hybridkv.model.models.granitemoehybrid import GraniteMoeHybridForCausalLM
from hybridkv.model.models.qwen3 import Qwen3ForCausalLM
from hybridkv.native.runner import OpKind


@dataclass(frozen=True, slots=True)
class FamilyScales:
    """What a family's ``embed_input`` multiplies the rows by and its ``compute_logits``
    divides the lm_head's output by (None: nothing), and whether it soft-caps the logits."""

    embed: float | None
    logits: float | None
    softcap: bool = False


def family_scales(model: CausalLM) -> FamilyScales:
    if isinstance(model, Gemma3ForCausalLM):  # and its ConditionalGeneration subclass
        embed = float(torch.tensor(model.embed_scale, dtype=torch.float32))
        return FamilyScales(embed, None, bool(model.final_softcap))
    if isinstance(model, GraniteMoeHybridForCausalLM):
        return FamilyScales(float(model.embedding_multiplier), float(model.logits_scaling))
    if isinstance(model, Qwen3ForCausalLM):
        return FamilyScales(None, None)
    raise Unsupported(f"no embedding or head plan for {type(model).__name__}")


def embed(b: ProgramBuilder, model: CausalLM, out: Rows) -> None:
    """``out[t] = embed_input(ids)[t]`` for the step's ids (``hk_step.ids``)."""
    table = model.embedding()
    scale = family_scales(model).embed
    weight = table.weight.detach()
    if out.width != table.embedding_dim or not weight.is_contiguous():
        raise Unsupported(f"an embedding of {table.embedding_dim} into rows of {out.width}")
    if isinstance(table, QuantEmbedding):
        if table.quant is None or table.out_dtype != torch.float32:
            raise Unsupported(f"a quantized embedding into {table.out_dtype}")
        b.keep.append(weight)
        fmt, row_bytes = table.quant.layout.ggml_type, int(weight.shape[1])
    else:
        b.pin(weight, "embedding")
        fmt, row_bytes = -1, 0
    sizes = (out.width, int(weight.shape[0]), fmt, row_bytes, out.stride, int(scale is not None))
    b.emit(OpKind.EMBED, (weight.data_ptr(), out.address), sizes, (scale or 0.0,))
