"""Projections with block-quantized weights (``layers/quant_linear.py``): a quantized
``Linear`` equals ``F.linear`` with its dequantized weight at decode rows (native kernel) and
prefill rows (dequantized panels), with and without the native library (decode rows of
``INT8_FORMATS``: with the activations as the int8 kernel rounds them); fused q/k/v with one
format fuse the bytes, with mixed formats run part by part; the weight stays uint8."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from hybridkv.model.layers import quant_linear as ql
from hybridkv.model.layers.fused import FusedLinear
from hybridkv.model.layers.linear import Linear
from hybridkv.native.quant import load_quant
from hybridkv.native.quant_blocks import QuantFormat, dequantize, pack, quantize_activations


def quantized_linear(n: int, k: int, fmt: QuantFormat, bias: bool = False, seed: int = 0) -> Linear:
    gen = torch.Generator().manual_seed(seed)
    layer = Linear(k, n, bias=bias)
    w = torch.randn(n, k, generator=gen) * 0.05
    ql.set_quantized_weight(layer, torch.from_numpy(pack(w.numpy(), fmt)), fmt)
    if bias:
        layer.bias.data = torch.randn(n, generator=gen)
    return layer


def float_weight(layer: Linear) -> torch.Tensor:
    assert layer.quant is not None
    return torch.from_numpy(dequantize(layer.weight.numpy(), layer.quant, layer.in_features))


def assert_matches_float(layer: Linear, x: torch.Tensor) -> None:
    with torch.inference_mode():
        got = layer(x)
    assert layer.quant is not None
    if layer.quant in ql.INT8_FORMATS and x.shape[0] <= ql.int8_max_rows(layer.quant):
        x = torch.from_numpy(quantize_activations(x.numpy(), layer.quant))
    ref = F.linear(
        x.double(),
        float_weight(layer).double(),
        None if layer.bias is None else layer.bias.double(),
    )
    bound = 1e-5 * (x.double().abs() @ float_weight(layer).double().abs().T) + 1e-6
    assert got.dtype == x.dtype and ((got.double() - ref).abs() <= bound).all()


@pytest.mark.parametrize(
    "fmt", [QuantFormat.Q8_0, QuantFormat.Q4_K, QuantFormat.Q6_K], ids=["Q8_0", "Q4_K", "Q6_K"]
)
@pytest.mark.parametrize("rows", [1, 5, ql.QUANT_MAX_ROWS + 1, 70, ql.INT8_MAX_ROWS + 1])
def test_matches_dequantized_float(fmt: QuantFormat, rows: int) -> None:
    layer = quantized_linear(ql.PANEL_ROWS + 44, 512, fmt, bias=True)  # two panels
    assert layer.weight.dtype == torch.uint8 and layer.weight.numel() == (
        ql.PANEL_ROWS + 44
    ) * fmt.row_bytes(512)
    assert_matches_float(layer, torch.randn(rows, 512))


def test_without_native_library(monkeypatch: pytest.MonkeyPatch) -> None:
    layer = quantized_linear(40, 256, QuantFormat.Q8_0)
    x = torch.randn(3, 256)
    xq = torch.from_numpy(quantize_activations(x.numpy(), QuantFormat.Q8_0))  # what int8 reads
    with torch.inference_mode():
        native = layer(x)
        monkeypatch.setattr(ql, "load_quant", lambda: None)
        fallback = layer(xq)
    torch.testing.assert_close(fallback, native, rtol=1e-5, atol=1e-6)
    with torch.inference_mode():
        panels = ql.quant_linear(torch.randn(30, 256), layer.weight, QuantFormat.Q8_0)
    assert panels.shape == (30, 40)


def test_bfloat16_activations_answer_in_bfloat16() -> None:
    layer = quantized_linear(32, 256, QuantFormat.Q4_K)
    with torch.inference_mode():
        out = layer(torch.randn(2, 256, dtype=torch.bfloat16))
    assert out.dtype == torch.bfloat16 and out.shape == (2, 32)


@pytest.mark.parametrize("mixed", [False, True])
def test_fused_parts(mixed: bool) -> None:
    second = QuantFormat.Q8_0 if mixed else QuantFormat.Q4_K
    parts = [quantized_linear(64, 256, QuantFormat.Q4_K, seed=1),
             quantized_linear(32, 256, second, seed=2), quantized_linear(32, 256, QuantFormat.Q4_K, seed=3)]  # fmt: skip
    x = torch.randn(4, 256)
    with torch.inference_mode():
        fused = FusedLinear(parts)(x)
        alone = torch.cat([p(x) for p in parts], dim=-1)
    assert torch.equal(fused, alone)


def test_wrong_blocks_refused() -> None:
    layer = Linear(256, 8, bias=False)
    with pytest.raises(ValueError, match="uint8"):
        ql.set_quantized_weight(layer, torch.zeros(8, 100, dtype=torch.uint8), QuantFormat.Q4_K)
    with pytest.raises(ValueError, match="multiple of 256"):
        ql.set_quantized_weight(
            Linear(100, 8), torch.zeros(8, 1, dtype=torch.uint8), QuantFormat.Q4_K
        )
    assert layer.quant is None and layer.weight.dtype == torch.float32  # left as it was


def test_quantized_embedding_dequantizes_the_rows_looked_up() -> None:
    table = torch.randn(50, 256) * 0.1
    data = torch.from_numpy(pack(table.numpy(), QuantFormat.Q6_K))
    emb = ql.QuantEmbedding(data, QuantFormat.Q6_K, 256, torch.bfloat16)
    ids = torch.tensor([[3, 49], [0, 3]])
    with torch.inference_mode():
        got = emb(ids)
    full = torch.from_numpy(dequantize(data.numpy(), QuantFormat.Q6_K, 256))
    assert got.shape == (2, 2, 256) and got.dtype == torch.bfloat16
    assert torch.equal(got, full[ids].to(torch.bfloat16))
    assert emb.weight.dtype == torch.uint8  # the table stays blocks
    with pytest.raises(IndexError):
        emb(torch.tensor([50]))
    with pytest.raises(ValueError, match="uint8"):
        ql.QuantEmbedding(data[:, :100], QuantFormat.Q6_K, 256, torch.float32)


def test_choose_path_thresholds() -> None:
    """The K-quants take int8 activations up to ``INT8_MAX_ROWS`` rows, and at any row count
    where the build has the tiled kernel (AVX2: it beats the panels there, measured);
    Q8_0 int8 activations up to ``QUANT_MAX_ROWS`` (the float32 kernel when ``INT8_FORMATS``
    leaves it out); past them, and without the native library, the dequantized panels."""
    path = ql.QuantPath
    for fmt in (QuantFormat.Q4_K, QuantFormat.Q6_K):
        for tiled in (True, False):
            assert ql.choose_path(fmt, 1, tiled=tiled) is path.INT8_KERNEL
            assert ql.choose_path(fmt, ql.INT8_MAX_ROWS, tiled=tiled) is path.INT8_KERNEL
        assert ql.choose_path(fmt, ql.INT8_MAX_ROWS + 1, tiled=False) is path.PANELS
        assert ql.choose_path(fmt, 1, native=False) is path.PANELS
        assert ql.choose_path(fmt, 8192, tiled=True) is path.INT8_KERNEL
    for tiled in (True, False):
        assert ql.choose_path(QuantFormat.Q8_0, 1, tiled=tiled) is path.INT8_KERNEL
        assert ql.choose_path(QuantFormat.Q8_0, ql.QUANT_MAX_ROWS, tiled=tiled) is path.INT8_KERNEL
        assert ql.choose_path(QuantFormat.Q8_0, ql.QUANT_MAX_ROWS + 1, tiled=tiled) is path.PANELS
    assert ql.choose_path(QuantFormat.Q8_0, 1, native=False) is path.PANELS
    assert ql.INT8_MAX_ROWS == 256


def test_int8_rows_table_follows_the_build() -> None:
    """``int8_max_rows`` without ``tiled`` asks this process's kernel build."""
    kernel = load_quant()
    tiled = kernel is not None and kernel.tile_rows > 0
    for fmt in ql.INT8_FORMATS:
        assert ql.int8_max_rows(fmt) == ql.INT8_ROWS_TABLE[fmt, tiled]
