"""Where a bfloat16 model's matrix products run: natively, or in float32 on CPUs without
bfloat16 arithmetic.

On a CPU with native bfloat16 dot products (AVX512-BF16, AMX) oneDNN multiplies bfloat16 fast.
Without them (AVX2-only x86, e.g. AMD Zen 2/3) it emulates them about ten times slower than a
float32 product of the same shape. ``bf16_matmul`` chooses:

- ``native``: bfloat16 weights, bfloat16 products (whatever the CPU does with them);
- ``float32``: the matmul weights (every ``Linear``, MoE experts, an untied copy of a tied
  ``lm_head``) are held in float32 and attention is computed in float32; activations, the
  embedding, norms and the KV cache stay bfloat16 and every product is rounded back to bfloat16,
  so the numerics are bfloat16's up to summation order. Costs the weights' memory twice over;
- ``auto`` (default): ``native`` where bfloat16 products pay (``bf16_matmul_pays``: AMX on
  x86), else ``float32``.

Measured on an AVX512-BF16 Xeon without AMX (docs/benchmarks.md, issue 17, one thread, the
small checkpoints' projections): oneDNN's bfloat16 GEMM is level with MKL's float32 one at 16
rows and 1.75x slower at 2,048 rows, and MKL's packed float32 GEMM is 1.7x
faster than either at 16 rows — so without AMX ``float32`` wins in both phases and ``auto``
picks it; with AMX tiles bfloat16 products run several times faster than float32 ones.

float32 models are never touched.
"""

from __future__ import annotations

import platform

import torch
from torch import nn

from hybridkv.config import BF16_MATMUL_CHOICES
from hybridkv.model.layers.attention import PagedAttention
from hybridkv.model.layers.linear import Linear
from hybridkv.model.layers.mlp import TopKMoE
from hybridkv.model.models.common import CausalLM


def cpu_has_native_bf16() -> bool:
    """Whether oneDNN multiplies bfloat16 natively on this CPU."""
    probe = getattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", None)
    return bool(probe()) if probe is not None else False


def bf16_matmul_pays() -> bool:
    """Whether bfloat16 products beat float32 ones here: x86 with AMX tiles; elsewhere (ARM)
    wherever oneDNN multiplies bfloat16 natively."""
    if platform.machine().lower() in ("x86_64", "amd64", "i386", "i686"):
        probe = getattr(torch.cpu, "_is_amx_tile_supported", None)
        return bool(probe()) if probe is not None else False
    return cpu_has_native_bf16()


def matmul_dtype(model_dtype: torch.dtype, bf16_matmul: str) -> torch.dtype:
    """The dtype products are computed in for a model stored in ``model_dtype``."""
    if bf16_matmul not in BF16_MATMUL_CHOICES:
        raise ValueError(
            f"invalid bf16_matmul {bf16_matmul!r}; expected one of {', '.join(BF16_MATMUL_CHOICES)}"
        )
    if model_dtype != torch.bfloat16 or bf16_matmul == "native":
        return model_dtype
    if bf16_matmul == "auto" and bf16_matmul_pays():
        return model_dtype
    return torch.float32


def upcast_matmuls(model: CausalLM, dtype: torch.dtype) -> None:
    """Hold every matmul weight of ``model`` in ``dtype`` and attend in ``dtype``."""
    if model.lm_head.weight is model.embedding().weight:
        model.lm_head.weight = nn.Parameter(model.lm_head.weight.detach(), requires_grad=False)
    for module in model.modules():
        if isinstance(module, Linear):
            if module.quant is not None:  # GGUF blocks stay blocks: their product is float32
                continue
            for param in module.parameters(recurse=False):
                param.data = param.data.to(dtype)
        elif isinstance(module, TopKMoE):
            for param in (module.input_linear.weight, module.output_linear.weight):
                _upcast_experts(param, dtype)
        elif getattr(module, "is_expert_stack", False):  # [E, out, in] expert weights
            for param in module.parameters(recurse=False):
                _upcast_experts(param, dtype)
        elif isinstance(module, PagedAttention):
            module.compute_dtype = dtype


def _upcast_experts(param: nn.Parameter, dtype: torch.dtype) -> None:
    if getattr(param, "quant", None) is None:  # GGUF expert blocks stay blocks
        param.data = param.data.to(dtype)
