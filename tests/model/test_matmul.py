"""Where a bfloat16 model multiplies (``hybridkv.model.loading.matmul``): the choice, the float32
path's numerics, and what an upcast model holds."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from hybridkv.config import EngineConfig
from hybridkv.model.layers.attention import PagedAttention
from hybridkv.model.layers.linear import Linear, linear
from hybridkv.model.layers.mlp import TopKMoE
from hybridkv.model.loading import matmul
from hybridkv.model.loading.loader import load_model


@pytest.mark.parametrize(
    ("option", "native", "want"),
    [
        ("auto", True, torch.bfloat16),
        ("auto", False, torch.float32),
        ("native", False, torch.bfloat16),
        ("float32", True, torch.float32),
    ],
)
def test_bfloat16_models_multiply_where_the_option_and_cpu_say(
    option: str, native: bool, want: torch.dtype, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(matmul, "bf16_matmul_pays", lambda: native)
    assert matmul.matmul_dtype(torch.bfloat16, option) == want
    assert matmul.matmul_dtype(torch.float32, option) == torch.float32  # never touched


@pytest.mark.parametrize(
    ("machine", "amx", "onednn_bf16", "want"),
    [
        ("x86_64", True, True, True),
        ("x86_64", False, True, False),  # AVX512-BF16 without AMX: float32 wins (measured)
        ("aarch64", False, True, True),
        ("aarch64", False, False, False),
    ],
)
def test_bfloat16_products_pay_with_amx_on_x86(
    machine: str, amx: bool, onednn_bf16: bool, want: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(matmul.platform, "machine", lambda: machine)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx, raising=False)
    monkeypatch.setattr(matmul, "cpu_has_native_bf16", lambda: onednn_bf16)
    assert matmul.bf16_matmul_pays() is want


def test_an_unknown_option_is_an_error_naming_it() -> None:
    with pytest.raises(ValueError, match="bf16_matmul 'fast'"):
        matmul.matmul_dtype(torch.bfloat16, "fast")
    with pytest.raises(ValueError, match="bf16_matmul='fast'.*auto, native, float32"):
        EngineConfig.create("m", bf16_matmul="fast")
    assert EngineConfig.create("m", bf16_matmul="float32").bf16_matmul == "float32"


def test_float32_products_are_rounded_back_to_bfloat16() -> None:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(5, 64, generator=gen).to(torch.bfloat16)
    w = torch.randn(32, 64, generator=gen).to(torch.bfloat16)
    out = linear(x, w.float())
    assert out.dtype == torch.bfloat16
    assert torch.equal(out, F.linear(x.float(), w.float()).to(torch.bfloat16))
    native = F.linear(x, w)  # bfloat16 kernel: float32 accumulation, one rounding
    assert torch.allclose(out.float(), native.float(), rtol=2**-7, atol=1e-2)
    same = linear(x, w)  # equal dtypes: plain F.linear, no casts
    assert torch.equal(same, native)


@pytest.mark.parametrize("arch", ["gemma3", "granitemoehybrid_moe"])
def test_upcast_model_holds_float32_matmul_weights_and_bfloat16_everything_else(
    arch: str, hf_checkpoints: dict[str, Path]
) -> None:
    native, _ = load_model(hf_checkpoints[arch], "bfloat16", "native")
    upcast, cfg = load_model(hf_checkpoints[arch], "bfloat16", "float32")
    linears = [m for m in upcast.modules() if isinstance(m, Linear)]
    assert linears and all(m.weight.dtype == torch.float32 for m in linears)
    attention = [m for m in upcast.modules() if isinstance(m, PagedAttention)]
    assert attention and all(m.compute_dtype == torch.float32 for m in attention)
    embed = upcast.model.embed_tokens.weight  # type: ignore[union-attr]
    assert embed.dtype == torch.bfloat16
    # the float32 weights hold exactly the bfloat16 checkpoint values
    assert torch.equal(upcast.lm_head.weight, native.lm_head.weight.float())
    if cfg.tie_word_embeddings:  # an untied float32 copy; the embedding stays bfloat16
        assert upcast.lm_head.weight is not embed
        assert torch.equal(upcast.lm_head.weight, embed.float())
    for moe in (m for m in upcast.modules() if isinstance(m, TopKMoE)):
        assert moe.input_linear.weight.dtype == torch.float32
