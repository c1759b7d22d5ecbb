"""The quantization quality gate: a quantized model under teacher forcing against the same
weights dequantized to float32 through the float32 path (the reference).

Both models read one token sequence: all but its last ``DECODE_STEPS`` tokens in one prefill
step (the dequantized-panel path), the rest one token per step (the native decode kernel). At every position: does the
quantized model's top token equal the reference's (top-1 agreement), and how far apart are
the two log-probabilities of the reference's top token (mean |delta logprob|)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from hybridkv.kv.spec import create_layout
from hybridkv.model.config.model_config import ModelConfig
from hybridkv.model.layers.linear import Linear
from hybridkv.model.layers.quant_linear import QUANT_MAX_ROWS, dequantize_linear_
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


def teacher_forced_logits(
    model: CausalLM, cfg: ModelConfig, ids: list[int], dtype: str = "float32"
) -> torch.Tensor:
    """Logits ``[len(ids), V]``: all but the last ``DECODE_STEPS`` tokens prefilled in one
    step (more rows than ``QUANT_MAX_ROWS``: dequantized panels), then one per step (the
    decode kernel)."""
    layout = create_layout(cfg.layer_specs(16, dtype))
    runner = ModelRunner(model, cfg, layout, 64, 4, keep_logits=True)
    driver = RunnerDriver(runner)
    driver.add("r", ids)
    assert len(ids) - DECODE_STEPS > QUANT_MAX_ROWS, "the prefill would not take the panels"
    driver.step({"r": len(ids) - DECODE_STEPS})
    driver.decode_all(["r"], DECODE_STEPS)
    return driver.all_logits("r")[: len(ids)]


def quality_gate(model_dir: Path, ids: list[int], original_dir: Path | None = None) -> GateResult:
    """The quantized model at ``model_dir`` against its weights dequantized (``original_dir``
    None), or against the float checkpoint it was quantized from (``original_dir``: what the
    format's rounding costs)."""
    quant, cfg = load_model(model_dir)
    num_quantized = sum(isinstance(m, Linear) and m.quant is not None for m in quant.modules())
    assert num_quantized > 0, "nothing in this model is quantized"
    reference, _ = load_model(original_dir or model_dir)
    for module in reference.modules():
        if isinstance(module, Linear):
            dequantize_linear_(module)
    return compare_models(quant, reference, cfg, ids)


def compare_models(
    quant: CausalLM, reference: CausalLM, cfg: ModelConfig, ids: list[int]
) -> GateResult:
    """The gate's numbers of ``quant`` against ``reference`` (same config) over ``ids``."""
    with torch.inference_mode():
        got = torch.log_softmax(teacher_forced_logits(quant, cfg, ids).double(), -1)
        ref = torch.log_softmax(teacher_forced_logits(reference, cfg, ids).double(), -1)
    top = ref.argmax(-1)  # [L]
    agree = (got.argmax(-1) == top).double().mean().item()
    delta = (got.gather(-1, top[:, None]) - ref.gather(-1, top[:, None])).abs().mean().item()
    return GateResult(agree, delta, len(ids))
