"""benchmarks/quant_gguf_decode.py --quick on a tiny GGUF (Q4_K and Q6_K projections) runs and
prints its JSON: every quantized projection but the embedding counted once."""

from __future__ import annotations

from pathlib import Path

from hybridkv.native.quant import load_quant
from hybridkv.native.quant_blocks import QuantFormat
from tests.benchmarks.quick import run_quick
from tests.native.no_compiler import built_or_skip
from tests.support.gguf_checkpoints import make_gguf_checkpoint, make_gguf_hf_checkpoint


def test_quant_gguf_decode_quick(tmp_path: Path) -> None:
    built_or_skip(load_quant())
    hf_dir = make_gguf_hf_checkpoint("qwen3", tmp_path / "hf")
    formats = {"ffn_down": QuantFormat.Q6_K, "": QuantFormat.Q4_K}
    path = make_gguf_checkpoint("qwen3", hf_dir, tmp_path / "m.gguf", formats)
    out = run_quick("quant_gguf_decode.py", str(path))
    assert out["benchmark"] == "quant_gguf_decode" and out["formats"] == ["Q4_K", "Q6_K"]
    # 2 layers x (q, k, v, o: 256 x 256 each; gate, up: 512 x 256) in Q4_K, down (256 x 512)
    # in Q6_K, and an untied lm_head, if any, in Q4_K
    layer = (4 * 256 * 256 + 2 * 512 * 256) * 144 / 256 + 256 * 512 * 210 / 256
    assert out["weight_mb"] * 1e6 >= 2 * layer
    [row] = out["results"]
    assert row["threads"] == 1 and row["step_ms"] > 0 and row["x_paired_floor"] > 0
