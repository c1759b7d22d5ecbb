"""The quantization quality gate: a quantized model under teacher forcing against the same
weights dequantized to float32 through the float32 path (the reference).

Both models read one token sequence: all but its last ``decode_steps`` tokens in one prefill
step (the dequantized-panel path; for ``INT8_FORMATS`` up to ``INT8_MAX_ROWS`` rows the int8
kernel), the rest one token per step (the native decode kernel: int8 activations for
``INT8_FORMATS``). At every position: does the quantized model's
top token equal the reference's (top-1 agreement), and how far apart are the two
log-probabilities of the reference's top token (mean |delta logprob|); the same over the
decode positions alone (``decode_*``: what the decode kernel's numerics cost)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from hybridkv.kv.spec import create_layout
from hybridkv.model.config.model_config import ModelConfig
from hybridkv.model.layers import quant_linear
from hybridkv.model.layers.linear import Linear
from hybridkv.model.layers.quant_linear import (
    QUANT_MAX_ROWS,
    dequantize_experts_,
    dequantize_linear_,
)
from hybridkv.model.loading.loader import load_model
from hybridkv.model.models.common import CausalLM
from hybridkv.model.step.runner import ModelRunner
from tests.support.driver import RunnerDriver

DECODE_STEPS = 8


@dataclass(frozen=True)
class GateResult:
    top1_agreement: float
    mean_abs_delta_logprob: float
    num_positions: int
    decode_top1_agreement: float
    decode_mean_abs_delta_logprob: float


def teacher_forced_logits(
    model: CausalLM,
    cfg: ModelConfig,
    ids: list[int],
    dtype: str = "float32",
    decode_steps: int = DECODE_STEPS,
) -> torch.Tensor:
    """Logits ``[len(ids), V]``: all but the last ``decode_steps`` tokens prefilled in one
    step (more rows than ``QUANT_MAX_ROWS``: dequantized panels), then one per step (the
    decode kernel)."""
    layout = create_layout(cfg.layer_specs(16, dtype))
    runner = ModelRunner(model, cfg, layout, 64, 4, keep_logits=True)
    driver = RunnerDriver(runner)
    driver.add("r", ids)
    assert len(ids) - decode_steps > QUANT_MAX_ROWS, "the prefill would not take the panels"
    driver.step({"r": len(ids) - decode_steps})
    driver.decode_all(["r"], decode_steps)
    return driver.all_logits("r")[: len(ids)]


def quality_gate(
    model_dir: Path,
    ids: list[int],
    original_dir: Path | None = None,
    decode_steps: int = DECODE_STEPS,
    int8_decode: bool = True,
) -> GateResult:
    """The quantized model at ``model_dir`` against its weights dequantized (``original_dir``
    None), or against the float checkpoint it was quantized from (``original_dir``: what the
    format's rounding costs). ``int8_decode`` False: decode steps with float32 activations
    whatever ``quant_linear.INT8_FORMATS`` says (then only summation order differs
    from the dequantized reference); prefill steps of up to ``INT8_MAX_ROWS`` rows too."""
    quant, cfg = load_model(model_dir)
    num_quantized = sum(isinstance(m, Linear) and m.quant is not None for m in quant.modules())
    assert num_quantized > 0, "nothing in this model is quantized"
    reference, _ = load_model(original_dir or model_dir)
    for module in reference.modules():
        if isinstance(module, Linear):
            dequantize_linear_(module)
        dequantize_experts_(module)  # GGUF MoE experts kept in blocks
    return compare_models(quant, reference, cfg, ids, decode_steps, int8_decode)


def compare_models(
    quant: CausalLM,
    reference: CausalLM,
    cfg: ModelConfig,
    ids: list[int],
    decode_steps: int = DECODE_STEPS,
    int8_decode: bool = True,
) -> GateResult:
    """The gate's numbers of ``quant`` against ``reference`` (same config) over ``ids``
    (``decode_steps``, ``int8_decode``: as ``quality_gate``)."""
    saved = quant_linear.INT8_FORMATS
    if not int8_decode:
        quant_linear.INT8_FORMATS = frozenset()
    try:
        with torch.inference_mode():
            got, ref = (
                torch.log_softmax(
                    teacher_forced_logits(m, cfg, ids, "float32", decode_steps).double(), -1
                )
                for m in (quant, reference)
            )
    finally:
        quant_linear.INT8_FORMATS = saved
    top = ref.argmax(-1)  # [L]
    agree = got.argmax(-1) == top  # [L]
    delta = (got.gather(-1, top[:, None]) - ref.gather(-1, top[:, None])).abs()[:, 0]  # [L]
    tail = slice(len(ids) - decode_steps, None)
    return GateResult(
        agree.double().mean().item(),
        delta.mean().item(),
        len(ids),
        agree[tail].double().mean().item(),
        delta[tail].mean().item(),
    )
