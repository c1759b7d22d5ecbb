"""The greedy head of a decode program: ``compute_logits`` of the final hidden rows (the
lm_head GEMM on the kernel its Python call takes, then the family's scaling: Granite's
division by ``logits_scaling``) and each row's argmax (numpy's: the first maximum), run only
when every request of the step is plain greedy (``program.DecodeProgram``); otherwise the
logits come out of Python as before. A head the kernels cannot give bit for bit (Gemma's
``tanh`` soft-capping, a float32 lm_head ``F.linear`` would multiply) raises ``Unsupported``:
the program then runs without it."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import torch

from hybridkv.model.compiled.builder import ProgramBuilder, Rows, Unsupported
from hybridkv.model.compiled.embed import family_scales
from hybridkv.model.layers.linear import Linear
from hybridkv.model.models.common import CausalLM
from hybridkv.native.runner import OpKind


@dataclass(frozen=True, slots=True)
class Head:
    """Where the head's ops leave each row's token and its logit (``[max_rows]``)."""

    tokens: npt.NDArray[np.int64]  # [max_rows]: numpy views of the ops' outputs
    maxima: npt.NDArray[np.float32]  # not finite when the row must take the Python path


def greedy_head(b: ProgramBuilder, model: CausalLM, hidden: Rows) -> Head:
    """The head's ops after the program's; ``b.ops`` is left as it was if it raises."""
    scales = family_scales(model)
    if scales.softcap:
        raise Unsupported("final logit soft-capping (torch's tanh)")
    divisor = scales.logits
    lm_head = model.lm_head
    if not isinstance(lm_head, Linear) or lm_head.bias is not None:
        raise Unsupported(f"an lm_head {type(lm_head).__name__} with a bias or of no kernel")
    vocab = lm_head.out_features
    logits = Rows(b.pin(torch.empty(b.max_rows, vocab), "logits"), vocab, vocab)
    start = len(b.ops)
    try:
        b.linear(hidden, lm_head, logits)
    except Unsupported:
        del b.ops[start:]
        raise
    if divisor is not None:
        b.emit(OpKind.DIV, (logits.address,), (vocab, vocab), (divisor,))
    tokens = torch.zeros(b.max_rows, dtype=torch.int64)
    maxima = torch.zeros(b.max_rows, dtype=torch.float32)
    b.keep += [tokens, maxima]
    b.emit(OpKind.ARGMAX, (logits.address, tokens.data_ptr(), maxima.data_ptr()), (vocab, vocab))
    return Head(tokens.numpy(), maxima.numpy())
