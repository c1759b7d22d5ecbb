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
- a block-quantized MoE expert stack (``[E, out, in]``: ``ffn_*_exps``) keeps its blocks,
  uint8 ``[E, out, row_bytes]`` (``quant_linear.set_quantized_experts``);
- the converter's changes are undone: Gemma's norm weights lose the 1 it added
  (``config.NORM_SHIFT``).
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Iterable
from dataclasses import replace
from typing import Any

import numpy as np
import torch
from torch import nn

from hybridkv.model.config.errors import ModelLoadError
from hybridkv.model.layers.linear import Linear
from hybridkv.model.layers.quant_linear import (
    QuantEmbedding,
    set_quantized_experts,
    set_quantized_weight,
)
from hybridkv.model.loading.gguf.config import NORM_SHIFT, UNSHIFTED_NORM
from hybridkv.model.loading.gguf.file import GgufFile, GgufTensor
from hybridkv.model.loading.gguf.rewrites import GGML_MXFP4, GgufSource
from hybridkv.model.loading.gguf.sources import gguf_source
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
        source = gguf_source(file, name, names)
        tensors = [file.tensors.get(n) for n in source.names]
        if any(t is None for t in tensors):
            raise ModelLoadError(f"{file.path}: no GGUF tensor for {name!r} ({source.names})")
        used.update(source.names)
        if shift and name.endswith("norm.weight") and not name.endswith(UNSHIFTED_NORM):
            source = replace(source, undo=lambda values: values - shift)
        shape = tuple(getattr(module, attr).shape)
        _fill_one(file, model, (name, module, attr), _present(tensors), source, shape, dtype)
    unused = sorted(set(file.tensors) - used)
    if unused:
        log.warning("%s: %d GGUF tensors unused (%s...)", file.path, len(unused), unused[0])


def _present(tensors: list[GgufTensor | None]) -> list[GgufTensor]:
    return [t for t in tensors if t is not None]


def _fill_one(
    file: GgufFile,
    model: nn.Module,
    param: tuple[str, nn.Module, str],
    tensors: list[GgufTensor],
    source: GgufSource,
    shape: tuple[int, ...],
    dtype: torch.dtype,
) -> None:
    """Set one parameter from ``tensors`` (``source`` says how they combine)."""
    name, module, attr = param
    stored = tensors[0].shape  # the parts' rows add up
    if len(stored) >= 2:
        stored = (*stored[:-2], sum(t.shape[-2] for t in tensors), stored[-1])
    _check_orders(file, source, stored)
    if source.raw is not None:
        _fill_raw(file, module, attr, tensors, source, shape)
        return
    fmts = {QuantFormat.of_ggml_type(t.ggml_type) for t in tensors}
    fmt = fmts.pop() if len(fmts) == 1 else None  # one block format for every part, or None
    blocks = None if fmt is None else _block_order(source.cols, fmt)
    experts = len(shape) == len(stored) == 3  # [E, out, in]
    kept = isinstance(module, (Linear, nn.Embedding)) and attr == "weight" or experts
    kept = kept and source.in_blocks
    if fmt is not None and blocks is not None and kept:
        if stored != shape:
            raise ModelLoadError(f"{file.path}: {source.names} is {stored}, expected {shape}")
        data = _joined([_mapped(t.data) for t in tensors], source.rows)
        if len(blocks):  # [N, row_bytes] as [N, blocks, block_bytes]
            split = data.reshape(data.shape[0], -1, fmt.layout.block_bytes)
            data = split.index_select(1, torch.from_numpy(blocks)).reshape(data.shape)
        _set_blocks(model, param, data, fmt, dtype)
        return
    values = _joined([_float_values(file, t) for t in tensors], source.rows)
    if source.cols is not None:
        values = values.index_select(-1, torch.from_numpy(source.cols))
    if source.undo is not None:
        values = source.undo(values)
    if tuple(values.shape) != shape:
        raise ModelLoadError(
            f"{file.path}: {source.names} is {tuple(values.shape)}, expected {shape}"
        )
    module._parameters[attr] = nn.Parameter(values.to(dtype), requires_grad=False)


def _set_blocks(
    model: nn.Module,
    param: tuple[str, nn.Module, str],
    data: torch.Tensor,
    fmt: QuantFormat,
    dtype: torch.dtype,
) -> None:
    """A projection, an embedding or an expert stack (``[E, out, in]``) keeps ``data``."""
    name, module, attr = param
    in_dim = int(getattr(module, attr).shape[-1])
    if isinstance(module, Linear):
        set_quantized_weight(module, data, fmt)
    elif isinstance(module, nn.Embedding):  # a lookup dequantizes the rows it gathers
        model.set_submodule(name.removesuffix(".weight"), QuantEmbedding(data, fmt, in_dim, dtype))
    else:  # MoE experts: each expert's rows multiplied in blocks (``moe.expert_linear``)
        set_quantized_experts(module, attr, data, fmt, in_dim)


def _fill_raw(
    file: GgufFile,
    module: nn.Module,
    attr: str,
    tensors: list[GgufTensor],
    source: GgufSource,
    shape: tuple[int, ...],
) -> None:
    """A parameter made of MXFP4 blocks repacked by ``source.raw`` (gpt-oss's experts)."""
    assert source.raw is not None
    if any(t.ggml_type != GGML_MXFP4 for t in tensors):
        types = sorted({t.ggml_type for t in tensors})
        raise ModelLoadError(f"{file.path}: {source.names} must be MXFP4 blocks, got types {types}")
    data = _joined([_mapped(t.data) for t in tensors], source.rows)
    try:
        values = source.raw(data)
    except (ValueError, RuntimeError) as exc:  # a forged scale, blocks that do not split
        raise ModelLoadError(f"{file.path}: {source.names}: {exc}") from None
    if tuple(values.shape) != shape:
        raise ModelLoadError(
            f"{file.path}: {source.names} make {tuple(values.shape)}, expected {shape}"
        )
    module._parameters[attr] = nn.Parameter(values, requires_grad=False)


def _check_orders(file: GgufFile, source: GgufSource, stored: tuple[int, ...]) -> None:
    """A row or column order fits the stored tensor (else a forged or wrong-shaped file)."""
    for order, axis in ((source.rows, -2), (source.cols, -1)):
        if order is not None and (len(stored) < 2 or len(order) != stored[axis]):
            raise ModelLoadError(f"{file.path}: {source.names} has the wrong shape {stored}")


def _block_order(
    cols: np.ndarray[Any, Any] | None, fmt: QuantFormat
) -> np.ndarray[Any, Any] | None:
    """The order of whole blocks that ``cols`` is (empty: none to move); None when ``cols``
    moves values within blocks (the weight is then dequantized)."""
    if cols is None:
        return np.zeros(0, np.int64)
    size = fmt.layout.block_values
    runs = cols.reshape(-1, size) if len(cols) % size == 0 else None
    if runs is None or (runs != runs[:, :1] + np.arange(size)).any() or (runs[:, 0] % size).any():
        log.info("%s columns move within blocks: dequantized to float", fmt.name)
        return None
    return runs[:, 0] // size


def _joined(parts: list[torch.Tensor], rows: np.ndarray[Any, Any] | None) -> torch.Tensor:
    """``parts`` concatenated along their rows (axis -2), then ``rows`` picked in order."""
    out = parts[0] if len(parts) == 1 else torch.cat(parts, dim=-2)
    if rows is not None:
        out = out.index_select(-2, torch.from_numpy(rows))
    return out


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
    if fmt is None or len(tensor.shape) < 2:
        raise ModelLoadError(f"{file.path}: {tensor.name} has unsupported type {tensor.ggml_type}")
    log.info("%s: %s (%s) dequantized to float", file.path, tensor.name, fmt.name)
    blocks = np.asarray(tensor.data)  # [..., rows, row_bytes]
    flat = dequantize(blocks.reshape(-1, blocks.shape[-1]), fmt, tensor.shape[-1])
    return torch.from_numpy(flat).reshape(tensor.shape)
