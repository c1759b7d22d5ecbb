"""The quality gate of one GGUF file, as the GGUF tests run it (thresholds:
``tests/model/test_gguf_loading.py``, reasons in docs/quantization.md): against the same weights
dequantized only summation order may differ; against the float32 checkpoint it was written
from, the format's rounding within ``(min top-1, max mean |delta logprob|)``."""

from __future__ import annotations

from pathlib import Path

import torch

from hybridkv.model.loading.hub import resolve_model_dir
from tests.support.quant_gate import GateResult, quality_gate


def assert_file_within_gate(
    path: Path, hf_dir: Path, rounding: tuple[float, float], kernel_max_delta: float
) -> tuple[GateResult, GateResult]:
    """Both gates of the GGUF file ``path`` (64 seeded tokens); returns (vs dequantized, vs
    the float32 original) for the caller to print."""
    view = resolve_model_dir(str(path))
    ids = torch.randint(3, 1000, (64,), generator=torch.Generator().manual_seed(7)).tolist()
    same = quality_gate(view, ids, int8_decode=False)
    rounded = quality_gate(view, ids, original_dir=hf_dir)
    print(f"{path.name}: vs dequantized {same}; vs float32 original {rounded}")
    assert same.top1_agreement == 1.0 and same.mean_abs_delta_logprob <= kernel_max_delta
    min_agree, max_delta = rounding
    assert rounded.top1_agreement >= min_agree and rounded.mean_abs_delta_logprob <= max_delta
    return same, rounded
