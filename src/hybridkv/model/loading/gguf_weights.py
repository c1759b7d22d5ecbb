"""Fill a model built on the ``meta`` device from a GGUF file's tensors.

Names: our parameters carry the Hugging Face checkpoint names, which the ``gguf`` package's
``TensorNameMap`` (the table llama.cpp's converter uses) maps to GGUF's (``blk.3.attn_q``...).
Values:

- a projection (``layers/linear.py`` ``Linear``) stored in a block format hybridkv multiplies
  (Q8_0, Q4_K, Q6_K) keeps its blocks: the parameter is the memory-mapped uint8 rows, nothing
  is dequantized (``layers/quant_linear.py``);
- everything else (norms, the embedding, float32 / float16 / bfloat16 projections) becomes a
  float tensor of the model's dtype;
- a block-quantized embedding becomes a ``QuantEmbedding`` (a lookup dequantizes its rows);
- the converter's changes are undone: Gemma's norm weights lose the 1 it added
  (``gguf_config.NORM_SHIFT``).
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Iterable
from typing import Any

import numpy as np
import torch
from torch import nn

from hybridkv.model.config.errors import ModelLoadError
from hybridkv.model.layers.linear import Linear
from hybridkv.model.layers.quant_linear import QuantEmbedding, set_quantized_weight
from hybridkv.model.loading.gguf_config import NORM_SHIFT
from hybridkv.model.loading.gguf_file import GgufFile, GgufTensor
from hybridkv.native.quant_blocks import QuantFormat, dequantize

log = logging.getLogger(__name__)
F32, F16, BF16 = 0, 1, 30


def fill_from_gguf(
    file: GgufFile,
    model: nn.Module,
    params: Iterable[tuple[str, nn.Module, str]],
    num_layers: int,
    dtype: torch.dtype,
    skip: frozenset[str] = frozenset(),
) -> None:
    """Replace each ``(name, module, attr)`` parameter of ``model`` (names in ``skip`` left
    alone) by ``file``'s tensor; ``ModelLoadError`` for a missing tensor or a shape that
    differs."""
    import gguf

    arch = next((a for a, n in gguf.MODEL_ARCH_NAMES.items() if n == file.architecture), None)
    if arch is None:
        raise ModelLoadError(f"{file.path}: unknown GGUF architecture {file.architecture!r}")
    names = gguf.get_tensor_name_map(arch, num_layers)
    shift = NORM_SHIFT.get(file.architecture, 0.0)
    used: set[str] = set()
    for name, module, attr in params:
        if name in skip:
            continue
        theirs = names.get_name(name, try_suffixes=(".weight", ".bias"))
        tensor = file.tensors.get(theirs) if theirs is not None else None
        if tensor is None:
            raise ModelLoadError(f"{file.path}: no GGUF tensor for {name!r} ({theirs!r})")
        used.add(tensor.name)
        shape = tuple(getattr(module, attr).shape)
        if tensor.shape != shape:
            raise ModelLoadError(f"{file.path}: {tensor.name} is {tensor.shape}, expected {shape}")
        fmt = QuantFormat.of_ggml_type(tensor.ggml_type)
        if fmt is not None and isinstance(module, Linear) and attr == "weight":
            set_quantized_weight(module, _mapped(tensor.data), fmt)
            continue
        if fmt is not None and isinstance(module, nn.Embedding):  # stays quantized too
            table = QuantEmbedding(_mapped(tensor.data), fmt, shape[1], dtype)
            model.set_submodule(name.removesuffix(".weight"), table)
            continue
        values = _float_values(file, tensor)
        if shift and name.endswith("norm.weight"):
            values = values - shift
        module._parameters[attr] = nn.Parameter(values.to(dtype), requires_grad=False)
    unused = sorted(set(file.tensors) - used)
    if unused:
        log.warning("%s: %d GGUF tensors unused (%s...)", file.path, len(unused), unused[0])


def _mapped(data: np.ndarray[Any, Any]) -> torch.Tensor:
    """A tensor over the file's mapped bytes (read only: nothing writes a weight in place)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*not writable.*")
        return torch.from_numpy(data)


def _float_values(file: GgufFile, tensor: GgufTensor) -> torch.Tensor:
    """float32 (bfloat16 for BF16) values of ``tensor``, in memory of their own."""
    if tensor.ggml_type in (F32, F16):
        return _mapped(tensor.data).to(torch.float32, copy=True)
    if tensor.ggml_type == BF16:  # stored as uint8 [..., 2 * cols]
        return _mapped(tensor.data).view(torch.bfloat16).reshape(tensor.shape).clone()
    fmt = QuantFormat.of_ggml_type(tensor.ggml_type)
    if fmt is None or len(tensor.shape) != 2:
        raise ModelLoadError(f"{file.path}: {tensor.name} has unsupported type {tensor.ggml_type}")
    log.info("%s: %s (%s) dequantized to float", file.path, tensor.name, fmt.name)
    return torch.from_numpy(dequantize(np.asarray(tensor.data), fmt, tensor.shape[1]))
