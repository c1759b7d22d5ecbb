"""MoE experts from GGUF stay in their blocks: ``ffn_{gate,up,down}_exps`` (``[E, out, in]``)
become uint8 ``[E, out, row_bytes]`` stacks multiplied expert by expert on the quantized
kernels (``moe.expert_linear``), for Granite 4.0-H, Nemotron-H and Qwen3-Next; nothing is
dequantized to float32 in memory, so a loaded model's resident memory grows by about the
file's size."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch

from hybridkv import LLM, SamplingParams
from hybridkv.model.config.errors import ModelLoadError
from hybridkv.model.layers import quant_linear
from hybridkv.model.layers.linear import linear
from hybridkv.model.layers.moe import expert_linear
from hybridkv.model.layers.quant_linear import QUANT_MAX_ROWS, dequantize_experts_
from hybridkv.model.loading.gguf.view import view_dir
from hybridkv.model.loading.hub import resolve_model_dir
from hybridkv.model.loading.loader import load_model
from hybridkv.model.models.gpt_oss import Mxfp4Experts
from hybridkv.native.mxfp4 import dequantize_reference
from hybridkv.native.quant_blocks import QuantFormat, dequantize
from tests.model.test_gguf_loading import KERNEL_MAX_DELTA, ROUNDING_GATE
from tests.support.gguf_checkpoints import make_gguf_checkpoint, make_gguf_hf_checkpoint
from tests.support.gguf_gate import assert_file_within_gate
from tests.support.quant_gate import teacher_forced_logits

ARCHS = ("granitemoehybrid_moe", "nemotron_h", "qwen3_next")
FORMATS = (QuantFormat.Q8_0, QuantFormat.Q4_K, QuantFormat.Q6_K)
Files = dict[tuple[str, str], tuple[Path, Path]]
MXFP4_GATE = (0.5, 0.2)  # the Hub MXFP4 checkpoints' (docs/quantization.md)


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Files]:
    root = tmp_path_factory.mktemp("gguf-experts")
    out = {}
    for arch in ARCHS:
        hf_dir = make_gguf_hf_checkpoint(arch, root / f"{arch}-hf")
        for fmt in FORMATS:
            path = make_gguf_checkpoint(arch, hf_dir, root / f"{arch}-{fmt.name}.gguf", {"": fmt})
            out[arch, fmt.name] = (path, hf_dir)
    yield out
    for path, _ in out.values():
        shutil.rmtree(view_dir(path), ignore_errors=True)


def _stacks(model: torch.nn.Module) -> dict[str, torch.nn.Parameter]:
    return {n: p for n, p in model.named_parameters() if p.dim() == 3 and "conv1d" not in n}


@pytest.mark.parametrize("fmt", FORMATS, ids=[f.name for f in FORMATS])
@pytest.mark.parametrize("arch", ARCHS)
def test_experts_keep_their_blocks(arch: str, fmt: QuantFormat, files: Files) -> None:
    path, _ = files[arch, fmt.name]
    model, _ = load_model(resolve_model_dir(str(path)))
    stacks = _stacks(model)
    assert stacks and all(p.dtype == torch.uint8 and p.quant is fmt for p in stacks.values())
    param_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    assert param_bytes <= path.stat().st_size  # no float32 copy of anything quantized
    name, stack = next(iter(stacks.items()))
    module = model.get_submodule(name.rpartition(".")[0])
    dequantize_experts_(module)  # the quality gate's reference: the same values in float32
    values = getattr(module, name.rpartition(".")[2])
    rows = dequantize(stack.detach().reshape(-1, stack.shape[-1]).numpy(), fmt, values.shape[-1])
    assert values.dtype == torch.float32
    assert torch.equal(values, torch.from_numpy(rows).reshape(values.shape))


@pytest.mark.parametrize("num_rows", [3, QUANT_MAX_ROWS + 40])  # decode kernel, panels
def test_expert_linear_matches_the_dequantized_expert(
    files: Files, num_rows: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Float32 activations (int8 off: only summation order differs)."""
    monkeypatch.setattr(quant_linear, "INT8_FORMATS", frozenset())
    model, _ = load_model(resolve_model_dir(str(files["qwen3_next", "Q4_K"][0])))
    experts = model.get_submodule("model.layers.0.mlp.experts")
    stack = experts.down_proj  # [E, H, I] blocks
    x = torch.randn(num_rows, stack.in_features, generator=torch.Generator().manual_seed(1))
    got = expert_linear(x, stack, 2)
    dequantize_experts_(experts)
    want = linear(x, experts.down_proj[2])
    assert torch.allclose(got, want, rtol=1e-4, atol=1e-4 * float(want.abs().max()))


@pytest.mark.slow
@pytest.mark.parametrize("fmt", FORMATS, ids=[f.name for f in FORMATS])
def test_quality_gate_with_quantized_experts(fmt: QuantFormat, files: Files) -> None:
    """Granite's experts in blocks (Nemotron-H's and Qwen3-Next's: ``test_gguf_hybrids``)."""
    arch = "granitemoehybrid_moe"
    path, hf_dir = files[arch, fmt.name]
    assert_file_within_gate(path, hf_dir, ROUNDING_GATE[fmt], KERNEL_MAX_DELTA)


def test_granite_moe_generates(files: Files) -> None:
    path, _ = files["granitemoehybrid_moe", "Q4_K"]
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    with LLM(str(path), kv_cache_memory="16MiB", max_model_len=512, max_num_seqs=4) as llm:
        out = llm.generate(["Hello there, how"], params, use_tqdm=False)[0]
    assert len(out.token_ids) == 6


_RSS_PROBE = """
import json, sys, torch
from hybridkv.model.layers.quant_linear import dequantize_experts_
from hybridkv.model.loading.hub import resolve_model_dir
from hybridkv.model.config.errors import ModelLoadError
from hybridkv.model.loading.loader import load_model
from hybridkv.model.models.gpt_oss import Mxfp4Experts
from tests.support.quant_gate import teacher_forced_logits

def rss():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024

view = resolve_model_dir(sys.argv[1])
torch.ones(4) @ torch.ones(4)  # the runtime's own first-use memory
before = rss()
model, cfg = load_model(view)
if sys.argv[2] == "float":  # what loading did before: experts dequantized to float32
    for module in model.modules():
        dequantize_experts_(module)
with torch.inference_mode():
    teacher_forced_logits(model, cfg, list(range(3, 67)))
experts = sum(p.numel() for n, p in model.named_parameters() if p.dim() == 3 and "conv" not in n)
print(json.dumps({"delta": rss() - before, "expert_values": experts}))
"""


def _rss_growth(path: Path, mode: str) -> dict[str, int]:
    probe = [sys.executable, "-c", _RSS_PROBE, str(path), mode]
    done = subprocess.run(probe, capture_output=True, text=True, timeout=120, check=True)
    result: dict[str, int] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


@pytest.mark.slow
def test_resident_memory_is_about_the_file(tmp_path: Path) -> None:
    """A Granite 4.0-H MoE Q4_K file (4 experts of 512 on each of 4 layers), loaded and run
    in a fresh process, against the same with its experts dequantized to float32 (what the
    loader did before): the resident memory saved is most of the experts' float32 size."""
    hf_dir = make_gguf_hf_checkpoint("granitemoehybrid_moe", tmp_path / "hf")
    path = make_gguf_checkpoint(
        "granitemoehybrid_moe", hf_dir, tmp_path / "m.gguf", {"": QuantFormat.Q4_K}
    )
    try:
        blocks, floats = (_rss_growth(path, mode) for mode in ("blocks", "float"))
    finally:
        shutil.rmtree(view_dir(path), ignore_errors=True)
    float_experts = 4 * blocks["expert_values"]
    file_mib, blocks_mib, floats_mib = (
        x / 2**20 for x in (path.stat().st_size, blocks["delta"], floats["delta"])
    )
    print(f"file {file_mib:.1f} MiB; resident +{blocks_mib:.1f} MiB (blocks), "
          f"+{floats_mib:.1f} MiB (float experts)")  # fmt: skip
    assert floats["delta"] - blocks["delta"] > float_experts / 2


@pytest.mark.parametrize("bf16_matmul", ["float32", "native"])
def test_bfloat16_model_keeps_expert_blocks(files: Files, bf16_matmul: str) -> None:
    """A bfloat16 model keeps its expert blocks whatever ``bf16_matmul`` does to float
    weights (``upcast_matmuls`` leaves them alone), and runs."""
    view = resolve_model_dir(str(files["qwen3_next", "Q4_K"][0]))
    model, cfg = load_model(view, "bfloat16", bf16_matmul)
    stacks = _stacks(model)
    assert stacks and all(p.dtype == torch.uint8 for p in stacks.values())
    with torch.inference_mode():
        logits = teacher_forced_logits(model, cfg, list(range(3, 63)), "bfloat16")
    assert logits.shape == (60, cfg.vocab_size) and torch.isfinite(logits).all()


@pytest.fixture(scope="module")
def mxfp4(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Path]]:
    """gpt-oss with its experts in ggml MXFP4 (``gguf``'s quantizer), projections in Q8_0: a
    llama-quantize MXFP4_MOE file."""
    root = tmp_path_factory.mktemp("gguf-mxfp4")
    hf_dir = make_gguf_hf_checkpoint("gpt_oss", root / "hf")
    path = make_gguf_checkpoint("gpt_oss_mxfp4", hf_dir, root / "m.gguf", {"": QuantFormat.Q8_0})
    yield path, hf_dir
    shutil.rmtree(view_dir(path), ignore_errors=True)


def test_gpt_oss_mxfp4_experts_repacked(mxfp4: tuple[Path, Path]) -> None:
    """ggml's 17-byte MXFP4 blocks become the Hub layout ``Mxfp4Experts`` runs on
    ``native/mxfp4.c``: the same values as the ``gguf`` package's own dequantizer gives, gate
    and up rows interleaved back; no float copy."""
    path, _ = mxfp4
    model, _ = load_model(resolve_model_dir(str(path)))
    experts = model.get_submodule("model.layers.1.mlp.experts")
    assert isinstance(experts, Mxfp4Experts)
    param_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    assert param_bytes <= path.stat().st_size
    tensors = {t.name: t for t in gguf.GGUFReader(path).tensors}

    def theirs(name: str) -> torch.Tensor:
        t = tensors[f"blk.1.{name}.weight"]
        return torch.from_numpy(gguf.quants.dequantize(t.data, t.tensor_type))

    gate_up = dequantize_reference(experts.gate_up_proj_blocks, experts.gate_up_proj_scales)
    assert torch.equal(gate_up[:, 0::2], theirs("ffn_gate_exps"))
    assert torch.equal(gate_up[:, 1::2], theirs("ffn_up_exps"))
    down = dequantize_reference(experts.down_proj_blocks, experts.down_proj_scales)
    assert torch.equal(down, theirs("ffn_down_exps"))


@pytest.mark.slow
def test_gpt_oss_mxfp4_quality_gate_and_generate(mxfp4: tuple[Path, Path]) -> None:
    """Against the float32 checkpoint: the Hub MXFP4 gate (docs/quantization.md), here with
    Q8_0 projections too; then ``LLM`` generates from the file."""
    path, hf_dir = mxfp4
    assert_file_within_gate(path, hf_dir, MXFP4_GATE, KERNEL_MAX_DELTA)
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    with LLM(str(path), kv_cache_memory="16MiB", max_model_len=512, max_num_seqs=4) as llm:
        out = llm.generate(["Hello there, how"], params, use_tqdm=False)[0]
    assert len(out.token_ids) == 6


def test_gpt_oss_forged_mxfp4_scale_refused(mxfp4: tuple[Path, Path], tmp_path: Path) -> None:
    """An e8m0 scale of 255 (NaN) in a file's MXFP4 block fails the load, naming the tensor."""
    _, hf_dir = mxfp4

    def nan_scale(name: str, values: np.ndarray) -> np.ndarray:
        if name == "blk.2.ffn_down_exps.weight":
            values = values.copy()
            values[0, 0, 0] = 255  # the first block's scale byte
        return values

    path = make_gguf_checkpoint("gpt_oss_mxfp4", hf_dir, tmp_path / "nan.gguf", {}, nan_scale)
    try:
        with pytest.raises(ModelLoadError, match=r"ffn_down_exps.weight',\): MXFP4 scale 255"):
            load_model(resolve_model_dir(str(path)))
    finally:
        shutil.rmtree(view_dir(path), ignore_errors=True)


def test_gpt_oss_mixed_expert_types_refused(mxfp4: tuple[Path, Path], tmp_path: Path) -> None:
    """llama-quantize falls back per tensor (a width not a multiple of 32): a file whose
    expert stacks are partly MXFP4 is refused, not half read."""
    _, hf_dir = mxfp4

    def one_float(name: str, values: np.ndarray) -> np.ndarray:
        if name != "blk.0.ffn_down_exps.weight":
            return values
        return gguf.quants.dequantize(values, gguf.GGMLQuantizationType.MXFP4)

    path = make_gguf_checkpoint("gpt_oss_mxfp4", hf_dir, tmp_path / "mix.gguf", {}, one_float)
    with pytest.raises(ModelLoadError, match="some expert stacks are MXFP4 and some are not"):
        resolve_model_dir(str(path))
    assert not view_dir(path).exists()
