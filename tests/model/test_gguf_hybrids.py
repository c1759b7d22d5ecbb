"""GGUF files of the Mamba2 hybrids besides Granite: Nemotron-H (``nemotron_h_moe``: Mamba2,
MoE, attention, MLP layers) and Falcon-H1 (``falcon-h1``: Mamba2 beside attention in every
layer, MuP multipliers folded into the weights), written in the real format the way
llama.cpp's converter writes them (``tests/support/gguf_hybrids.py``). An F32 file gives the
checkpoint back (Falcon-H1: with its multipliers folded in), quantized files pass the quality
gate and generate, broken files fail with a ``ModelLoadError`` naming the problem."""

from __future__ import annotations

import dataclasses
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from safetensors.numpy import load_file

from hybridkv import LLM, SamplingParams
from hybridkv.model.config.errors import ModelLoadError
from hybridkv.model.layers.linear import Linear
from hybridkv.model.layers.quant_linear import dequantize_weight
from hybridkv.model.loading.gguf.view import view_dir
from hybridkv.model.loading.hub import resolve_model_dir
from hybridkv.model.loading.loader import load_model, load_model_config
from hybridkv.native.quant_blocks import QuantFormat
from tests.model.test_gguf_loading import KERNEL_MAX_DELTA, ROUNDING_GATE
from tests.support.gguf_checkpoints import make_gguf_checkpoint, make_gguf_hf_checkpoint
from tests.support.gguf_gate import assert_file_within_gate
from tests.support.gguf_hybrids import HYBRID_SIZES, falcon_folded
from tests.support.quant_gate import teacher_forced_logits

ARCHS = ("nemotron_h", "falcon_h1", "qwen3_next", "qwen3_5", "gpt_oss")
GATED = (QuantFormat.Q8_0, QuantFormat.Q4_K)
Files = dict[tuple[str, str], tuple[Path, Path]]


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Files]:
    """(arch, "F32" | "Q8_0" | "Q4_K") -> (GGUF file, the transformers checkpoint)."""
    root = tmp_path_factory.mktemp("gguf-hybrids")
    out = {}
    for arch in ARCHS:
        hf_dir = make_gguf_hf_checkpoint(arch, root / f"{arch}-hf")
        for name, formats in [("F32", {}), *((f.name, {"": f}) for f in GATED)]:
            path = make_gguf_checkpoint(arch, hf_dir, root / f"{arch}-{name}.gguf", formats)
            out[arch, name] = (path, hf_dir)
    yield out
    for path, _ in out.values():
        shutil.rmtree(view_dir(path), ignore_errors=True)


def _expected(arch: str, hf_dir: Path) -> dict[str, torch.Tensor]:
    """The checkpoint's parameters under our names, as the file should give them back."""
    theirs, _ = load_model(hf_dir)
    saved = load_file(str(hf_dir / "model.safetensors"))
    params = {}
    for name, param in theirs.named_parameters():
        if arch == "falcon_h1":  # the converter multiplied the multipliers in
            folded = falcon_folded(name, saved[name], HYBRID_SIZES[arch])
            param = torch.from_numpy(np.ascontiguousarray(folded))
        params[name] = param
    return params


@pytest.mark.parametrize("arch", ARCHS)
def test_metadata_becomes_config(arch: str, files: Files) -> None:
    path, hf_dir = files[arch, "Q8_0"]
    ours, theirs = load_model_config(resolve_model_dir(str(path))), load_model_config(hf_dir)
    assert ours.eos_token_ids == (2,)
    # sizes, layer kinds (Nemotron-H's pattern from the tensors present), Mamba2 sizes and
    # norm order, KV heads: as transformers' config.json says
    assert dataclasses.replace(ours, eos_token_ids=theirs.eos_token_ids) == theirs


@pytest.mark.parametrize("arch", ARCHS)
def test_float32_file_gives_the_checkpoint_back(arch: str, files: Files) -> None:
    """Every parameter (Nemotron-H's q/k rows unpermuted, experts stacked, Mamba2's
    ``-exp(A_log)`` and reshapes undone) equals the checkpoint's; the logits equal
    transformers' checkpoint run by hybridkv (Falcon-H1: multipliers of 1 on folded
    weights)."""
    path, hf_dir = files[arch, "F32"]
    ours, cfg = load_model(resolve_model_dir(str(path)))
    expected = _expected(arch, hf_dir)
    for name, param in ours.named_parameters():
        assert torch.allclose(param, expected[name], rtol=1e-6, atol=1e-7), name  # log(exp(x))
    theirs, _ = load_model(hf_dir)
    ids = list(range(3, 67))
    with torch.inference_mode():
        got, ref = (teacher_forced_logits(m, cfg, ids) for m in (ours, theirs))
    assert torch.allclose(got, ref, rtol=0, atol=1e-4)  # folding rounds each weight once


@pytest.mark.slow
@pytest.mark.parametrize("fmt", GATED, ids=[f.name for f in GATED])
@pytest.mark.parametrize("arch", ARCHS)
def test_quality_gate(arch: str, fmt: QuantFormat, files: Files) -> None:
    path, hf_dir = files[arch, fmt.name]
    assert_file_within_gate(path, hf_dir, ROUNDING_GATE[fmt], KERNEL_MAX_DELTA)


# float projections in a Q4_K file: the shared expert's [1, H] gate and gpt-oss's router (kept
# float, as llama-quantize keeps them); Qwen3.5's out_proj, whose columns the converter moved by value
# heads of 64 values, inside Q4_K's 256-value blocks (dequantized at load, logged)
FLOAT_LINEARS = {
    "qwen3_next": {"mlp.shared_expert_gate"},
    "qwen3_5": {"linear_attn.out_proj"},
    "gpt_oss": {"mlp.router"},  # the router kept float, as llama-quantize keeps it
}


@pytest.mark.parametrize("arch", ARCHS)
def test_quantized_file_generates(arch: str, files: Files) -> None:
    path, _ = files[arch, "Q4_K"]
    model, _ = load_model(resolve_model_dir(str(path)))
    linears = {n: m for n, m in model.named_modules() if isinstance(m, Linear)}
    floats = {n.split(".", 3)[-1] for n, m in linears.items() if m.quant is None}
    assert floats == FLOAT_LINEARS.get(arch, set())
    assert {m.quant for m in linears.values()} - {None} == {QuantFormat.Q4_K}
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    with LLM(str(path), kv_cache_memory="16MiB", max_model_len=512, max_num_seqs=4) as llm:
        out = llm.generate(["Hello there, how"], params, use_tqdm=False)[0]
    assert len(out.token_ids) == 6 and isinstance(out.text, str)


def _drop(target: str) -> Callable[[str, np.ndarray], np.ndarray | None]:
    return lambda name, values: None if name == target else values


def _cut(target: str) -> Callable[[str, np.ndarray], np.ndarray | None]:
    return lambda name, values: values[:-1] if name == target else values


@pytest.mark.parametrize(
    ("arch", "edit", "match"),
    [
        ("nemotron_h", _drop("blk.0.ssm_out.weight"), r"no GGUF tensor for 'model.layers.0.mixer"),
        ("nemotron_h", _cut("blk.1.ffn_down_exps.weight"), r"ffn_down_exps.weight',\) is \(3, "),
        ("falcon_h1", _drop("blk.2.ssm_a"), r"no GGUF tensor for 'model.layers.2.mamba.A_log'"),
        ("falcon_h1", _cut("blk.0.ssm_in.weight"), r"ssm_in.weight',\) is \(583, 256\)"),
        (
            "qwen3_next",
            _drop("blk.0.attn_gate.weight"),
            r"'model.layers.0.linear_attn.in_proj_qkvz",
        ),
        ("qwen3_5", _cut("blk.1.attn_qkv.weight"), r"attn_qkv.weight',\) has the wrong shape"),
    ],
    ids=[
        "nemotron-missing",
        "nemotron-experts-shape",
        "falcon-missing",
        "falcon-shape",
        "qwen3-next-missing-half",
        "qwen3.5-rows-do-not-fit",
    ],
)
def test_hostile_files_refused(
    arch: str,
    edit: Callable[[str, np.ndarray], np.ndarray | None],
    match: str,
    files: Files,
    tmp_path: Path,
) -> None:
    hf_dir = files[arch, "F32"][1]
    path = make_gguf_checkpoint(arch, hf_dir, tmp_path / "bad.gguf", {}, edit)
    try:
        with pytest.raises(ModelLoadError, match=match):
            load_model(resolve_model_dir(str(path)))
    finally:
        shutil.rmtree(view_dir(path), ignore_errors=True)


def test_value_head_columns_move_as_whole_blocks(files: Files) -> None:
    """Qwen3.5's out_proj in Q8_0: value heads of 64 columns are two whole 32-value blocks,
    so the converter's column order is undone on the blocks themselves: the weight stays
    quantized and its values are the checkpoint's, to Q8_0's rounding."""
    path, hf_dir = files["qwen3_5", "Q8_0"]
    model, _ = load_model(resolve_model_dir(str(path)))
    linear = model.get_submodule("model.layers.0.linear_attn.out_proj")
    assert isinstance(linear, Linear) and linear.quant is QuantFormat.Q8_0
    got = dequantize_weight(linear.weight, QuantFormat.Q8_0, linear.in_features)
    want = torch.from_numpy(
        load_file(str(hf_dir / "model.safetensors"))["model.layers.0.linear_attn.out_proj.weight"]
    )
    step = want.abs().max() / 127  # a Q8_0 step at most
    assert (got - want).abs().max() <= step / 2 + 1e-6


def test_one_dimensional_shared_expert_gate_accepted(files: Files, tmp_path: Path) -> None:
    """llama-quantize writes Qwen3-Next's ``[1, H]`` shared-expert gate as ``[H]``."""
    path, hf_dir = files["qwen3_next", "F32"]
    flat = make_gguf_checkpoint(
        "qwen3_next", hf_dir, tmp_path / "flat.gguf", {},
        lambda name, values: values.reshape(-1) if "gate_inp_shexp" in name else values,
    )  # fmt: skip
    try:
        ours, _ = load_model(resolve_model_dir(str(flat)))
    finally:
        shutil.rmtree(view_dir(flat), ignore_errors=True)
    name = "model.layers.0.mlp.shared_expert_gate.weight"
    assert torch.equal(ours.get_parameter(name), _expected("qwen3_next", hf_dir)[name])


def _forged(path: Path, arch: str, **values: int | float | list[int] | list[bool]) -> Path:
    """A header with ``arch``'s metadata ``values`` (``<arch>.`` prefixed) and an embedding."""
    writer = gguf.GGUFWriter(str(path), arch)
    for key, value in values.items():
        key = f"{arch}.{key.replace('__', '.')}"
        if isinstance(value, list):
            writer.add_array(key, value)
        elif isinstance(value, float):
            writer.add_float32(key, value)
        else:
            writer.add_uint32(key, value)
    writer.add_tensor("token_embd.weight", np.zeros((8, 4), np.float32))
    if arch == "nemotron_h_moe":  # its layer pattern comes from the tensors: layer 1 is MoE
        writer.add_tensor("blk.1.ffn_up_exps.weight", np.zeros((4, 8, 4), np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


_SIZES = {"embedding_length": 4, "attention__head_count": 1, "block_count": 4}
_SSM = {"ssm__inner_size": 8, "ssm__time_step_rank": 2, "ssm__group_count": 1,
        "ssm__state_size": 4, "ssm__conv_kernel": 4}  # fmt: skip
_MOE = {"expert_count": 4, "expert_used_count": 2, "expert_feed_forward_length": 8,
        "expert_shared_feed_forward_length": 8, "feed_forward_length": 8}  # fmt: skip


@pytest.mark.parametrize(
    ("arch", "values", "match"),
    [
        ("qwen35", {"attention__recurrent_layers": [1, 1, 1, 0]}, "must be bools"),
        ("qwen35", {"attention__recurrent_layers": [True]}, "must list 4 bools"),
        ("qwen35", {"rope__dimension_count": 1000}, "does not fit a head"),
        ("qwen3next", {"ssm__time_step_rank": 3}, "do not split into heads"),
        ("qwen3next", {"ssm__group_count": 3, **_MOE}, "do not split into heads"),
        ("qwen3next", {"expert_used_count": 5}, "'qwen3next.expert_used_count' must be"),
        ("nemotron_h_moe", {"expert_count": 10**9}, "'nemotron_h_moe.expert_count' must be"),
        ("nemotron_h_moe", {"expert_group_count": 3}, "4 experts do not split into 3 groups"),
        ("nemotron_h_moe", {"expert_weights_scale": float("nan")}, "must be a finite number"),
        ("falcon-h1", {"ssm__time_step_rank": 0}, "'falcon-h1.ssm.time_step_rank' must be"),
        ("falcon-h1", {"ssm__inner_size": 7}, "does not split into 2"),
    ],
)
def test_forged_metadata_refused(
    arch: str, values: dict[str, int | float | list[int]], match: str, tmp_path: Path
) -> None:
    """Forged sizes fail the view's config with a ``ModelLoadError`` naming the key, before
    anything is built."""
    every = {**_SIZES, **_SSM, **_MOE, "attention__head_count_kv": 1, **values}
    if arch == "nemotron_h_moe":
        every["attention__head_count_kv"] = [1, 0, 0, 0]
    path = _forged(tmp_path / "f.gguf", arch, **every)
    with pytest.raises(ModelLoadError, match=match):
        resolve_model_dir(str(path))
    assert not view_dir(path).exists()
