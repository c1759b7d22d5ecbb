"""The pieces ``sources`` and ``sources_gdn`` describe a parameter with: a
``GgufSource`` (which GGUF tensors, which row and column order, which value change undone)
and the small undo functions several families share."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from hybridkv.model.loading.gguf.file import GgufFile

GGML_MXFP4 = 39  # the ggml type of MXFP4 blocks: read only through a ``GgufSource.raw``
Undo = Callable[[torch.Tensor], torch.Tensor]
RawBytes = Callable[[torch.Tensor], torch.Tensor]  # uint8 [..., rows, row_bytes] -> parameter


@dataclass(frozen=True, slots=True)
class GgufSource:
    """``names``: GGUF tensors concatenated along their rows (axis -2 of a weight);
    ``rows``: a row order applied after (block rows move whole); ``cols``: a column order
    (axis -1: on block rows only when it moves whole blocks, else the weight is dequantized);
    ``undo``: on float values last, the inverse of the converter's value change (reshape,
    ``-exp``); ``in_blocks`` False: read as float values even from Q8_0 / Q4_K / Q6_K (the
    parameter's layout is not the file's, e.g. transposed); ``raw``: instead of all that, a
    change of the stored bytes of a block type with no kernel of its own here (ggml MXFP4 into
    the Hub's layout)."""

    names: tuple[str, ...]
    rows: np.ndarray | None = None
    cols: np.ndarray | None = None
    undo: Undo | None = None
    in_blocks: bool = True
    raw: RawBytes | None = None


Rule = Callable[[GgufFile, str], GgufSource]  # (file, "blk.N") -> the parameter's source


def a_log(a: torch.Tensor) -> torch.Tensor:
    return torch.log(-a.reshape(-1))  # A = -exp(A_log), [H] or [H, 1]


def flat(values: torch.Tensor) -> torch.Tensor:
    return values.reshape(-1)


def conv(values: torch.Tensor) -> torch.Tensor:
    return values.unsqueeze(1)  # [C, K] -> [C, 1, K]


def one(tensor: str, undo: Undo | None = None) -> Rule:
    """The layer's GGUF tensor ``tensor`` (``undo`` applied to its values)."""
    return lambda file, blk: GgufSource((f"{blk}.{tensor}",), undo=undo)
