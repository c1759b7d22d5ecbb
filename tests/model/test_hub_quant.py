"""The Hub's quantized checkpoints (``model/loading/hub_quant.py``), written in the real layouts
from tiny float32 ones (``tests/support/hub_checkpoints.py``): gpt-oss with MXFP4 experts keeps
them as the file has them (memory: the file's size) and generates; FP8 block-scaled Qwen3 and
Qwen3-Next load (dequantized at load, exactly the twin's weights) and generate; the quality
gate holds per format and family."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from hybridkv import LLM, SamplingParams
from hybridkv.model.config.errors import ModelLoadError
from hybridkv.model.config.quant_config import parse_hub_quant
from hybridkv.model.loading.loader import load_model
from hybridkv.model.models.gpt_oss import Mxfp4Experts
from tests.model.conftest import make_runner
from tests.support.checkpoints import SharedCheckpoints
from tests.support.driver import RunnerDriver
from tests.support.families import FamilyCheckpoints
from tests.support.hub_checkpoints import (
    gpt_oss_original,
    make_fp8_checkpoint,
    make_mxfp4_checkpoint,
)
from tests.support.quant_gate import compare_models, teacher_forced_logits

# the quality gate (docs/quantization.md "Hub formats"): against the same weights dequantized,
# float32 summation order alone; against the float32 original, from the format's rounding:
# measured (seeds 7, 8) MXFP4 experts 0.069-0.083, top-1 0.67-0.75; FP8 0.020-0.048, top-1
# 0.77-0.91 (flat random logits tie often): ~2x room on |d logprob|
KERNEL_MAX_DELTA = 1e-4
ROUNDING_GATE = {"mxfp4": (0.5, 0.2), "fp8": (0.6, 0.1)}  # (min top-1, max mean |d logprob|)

Pair = tuple[Path, Path, Path]  # (quantized, dequantized twin, float32 original)


@pytest.fixture(scope="module")
def hub_files(
    tmp_path_factory: pytest.TempPathFactory,
    shared_checkpoints: SharedCheckpoints,
    family_checkpoints: FamilyCheckpoints,
) -> Iterator[dict[str, Pair]]:
    root = tmp_path_factory.mktemp("hub_quant")
    gpt_oss = gpt_oss_original(root / "gpt_oss")
    qwen3, qwen3_next = shared_checkpoints.get("qwen3"), family_checkpoints["qwen3_next"]
    yield {
        "gpt_oss-mxfp4": (*make_mxfp4_checkpoint(gpt_oss, root / "gpt_oss-mxfp4"), gpt_oss),
        # the Hub's 128 x 128 blocks (partial at these sizes), and blocks finer than a row
        "qwen3-fp8": (*make_fp8_checkpoint(qwen3, root / "qwen3-fp8", (128, 128)), qwen3),
        "qwen3_next-fp8": (
            *make_fp8_checkpoint(qwen3_next, root / "qwen3_next-fp8", (32, 32)),
            qwen3_next,
        ),
    }


def _generate(model_dir: Path) -> list[int]:
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    with LLM(str(model_dir), kv_cache_memory="16MiB", max_model_len=512) as llm:
        out = llm.generate(["Hello there, how"], params, use_tqdm=False)[0]
    return list(out.token_ids)


def test_mxfp4_experts_stay_quantized_and_generate(hub_files: dict[str, Pair]) -> None:
    quant, twin, _ = hub_files["gpt_oss-mxfp4"]
    model, _ = load_model(quant)
    experts = [m for m in model.modules() if isinstance(m, Mxfp4Experts)]
    assert len(experts) == 4 and experts[0].gate_up_proj_blocks.dtype == torch.uint8
    param_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    assert param_bytes <= (quant / "model.safetensors").stat().st_size  # no float32 copy
    expert_bytes = sum(p.numel() * p.element_size() for e in experts for p in e.parameters())
    twin_model, _ = load_model(twin)
    float_bytes = sum(
        p.numel() * p.element_size()
        for name, p in twin_model.named_parameters()
        if ".experts." in name
    )
    assert expert_bytes * 6 < float_bytes  # 4.25 bits a weight (+ float biases) against 32
    assert _generate(quant) == _generate(twin)  # greedy: the same tokens as the float32 twin


@pytest.mark.parametrize("bf16_matmul", ["native", "float32"])
def test_mxfp4_in_a_bfloat16_model(bf16_matmul: str, hub_files: dict[str, Pair]) -> None:
    quant, twin, _ = hub_files["gpt_oss-mxfp4"]
    ids = torch.randint(3, 1000, (64,), generator=torch.Generator().manual_seed(5)).tolist()
    runner = make_runner(quant, dtype="bfloat16", bf16_matmul=bf16_matmul)
    experts = runner.model.model.layers[0].mlp.experts
    assert isinstance(experts, Mxfp4Experts) and experts.down_proj_blocks.dtype == torch.uint8
    driver = RunnerDriver(runner)
    driver.add("r", ids)
    driver.step({"r": 56})
    driver.decode_all(["r"], 8)
    ours = driver.all_logits("r")[:64].float()
    ref_model, cfg = load_model(twin)
    ref = teacher_forced_logits(ref_model, cfg, ids)  # float32, the same weights
    cos = torch.nn.functional.cosine_similarity(ours, ref, dim=-1)
    assert torch.isfinite(ours).all() and cos.min().item() > 0.98


@pytest.mark.parametrize("name", ["qwen3-fp8", "qwen3_next-fp8"])
def test_fp8_dequantized_at_load_and_generate(
    name: str, hub_files: dict[str, Pair], caplog: pytest.LogCaptureFixture
) -> None:
    quant, twin, _ = hub_files[name]
    with caplog.at_level("INFO", logger="hybridkv.model.loading.hub_quant"):
        model, _ = load_model(quant)
    assert "dequantized when loaded" in caplog.text
    reference = dict(load_model(twin)[0].named_parameters())
    for param_name, param in model.named_parameters():
        assert torch.equal(param, reference[param_name]), param_name
    assert _generate(quant) == _generate(twin)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["gpt_oss-mxfp4", "qwen3-fp8", "qwen3_next-fp8"])
def test_quality_gate(name: str, hub_files: dict[str, Pair]) -> None:
    quant_dir, twin, original = hub_files[name]
    ids = torch.randint(3, 1000, (64,), generator=torch.Generator().manual_seed(7)).tolist()
    quant, cfg = load_model(quant_dir)
    same = compare_models(quant, load_model(twin)[0], cfg, ids)  # the kernel: summation order
    assert same.top1_agreement == 1.0 and same.mean_abs_delta_logprob <= KERNEL_MAX_DELTA
    rounded = compare_models(quant, load_model(original)[0], cfg, ids)  # the format's rounding
    min_agree, max_delta = ROUNDING_GATE[name.rpartition("-")[2]]
    print(f"{name}: vs dequantized {same}; vs float32 original {rounded}")
    assert rounded.top1_agreement >= min_agree and rounded.mean_abs_delta_logprob <= max_delta


GOOD_FP8 = {"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": [128, 128]}


@pytest.mark.parametrize(
    ("spec", "arch", "message"),
    [
        ({"quant_method": "gptq"}, "Qwen3ForCausalLM", "quant_method 'gptq' is not supported"),
        ({**GOOD_FP8, "activation_scheme": "static"}, "Qwen3ForCausalLM", "activation_scheme"),
        ({**GOOD_FP8, "weight_block_size": [128]}, "Qwen3ForCausalLM", "weight_block_size"),
        ({**GOOD_FP8, "weight_block_size": [0, 128]}, "Qwen3ForCausalLM", "weight_block_size"),
        ({**GOOD_FP8, "weight_block_size": [1.5, 2]}, "Qwen3ForCausalLM", "weight_block_size"),
        ({**GOOD_FP8, "weight_block_size": None}, "Qwen3ForCausalLM", "weight_block_size"),
        ({**GOOD_FP8, "weight_block_size": [2**40, 1]}, "Qwen3ForCausalLM", "weight_block_size"),
        ({**GOOD_FP8, "fmt": "e5m2"}, "Qwen3ForCausalLM", "fmt"),
        ({**GOOD_FP8, "input_scale": 1.0}, "Qwen3ForCausalLM", "keys not supported"),
        ({**GOOD_FP8, "dequantize": True}, "Qwen3ForCausalLM", "dequantize"),
        ({"quant_method": "mxfp4"}, "Qwen3ForCausalLM", "gpt-oss only"),
        (
            {"quant_method": "mxfp4", "modules_to_not_convert": "lm_head"},
            "GptOssForCausalLM",
            "modules_to_not_convert",
        ),
        ([1, 2], "Qwen3ForCausalLM", "JSON object"),
    ],
)
def test_unsupported_quantization_config_refused(spec: object, arch: str, message: str) -> None:
    with pytest.raises(ModelLoadError, match=message):
        parse_hub_quant({"quantization_config": spec}, arch)


def test_modules_to_not_convert_patterns() -> None:
    quant = parse_hub_quant(
        {
            "quantization_config": {
                "quant_method": "mxfp4",
                "modules_to_not_convert": [
                    "model.layers.*.self_attn",
                    "model.layers.1.mlp.experts",
                ],
            }
        },
        "GptOssForCausalLM",
    )
    assert quant is not None and quant.converts("model.layers.0.mlp.experts")
    assert not quant.converts("model.layers.1.mlp.experts")
    assert not quant.converts("model.layers.3.self_attn.q_proj")
    assert parse_hub_quant({}, "Qwen3ForCausalLM") is None


def _forge(src: Path, dst: Path, edit: Callable[[dict[str, torch.Tensor]], None]) -> Path:
    shutil.copytree(src, dst)
    tensors = load_file(str(dst / "model.safetensors"))
    edit(tensors)
    save_file(tensors, str(dst / "model.safetensors"), metadata={"format": "pt"})
    return dst


SCALE = "model.layers.0.self_attn.q_proj.weight_scale_inv"
WEIGHT = "model.layers.0.self_attn.q_proj.weight"
FP8_FORGERIES: list[tuple[str, Callable[[dict[str, torch.Tensor]], None], str]] = [
    ("nan", lambda t: t[SCALE].fill_(float("nan")), "NaN, infinite or negative"),
    ("inf", lambda t: t[SCALE].fill_(float("inf")), "NaN, infinite or negative"),
    ("negative", lambda t: t[SCALE].mul_(-1), "NaN, infinite or negative"),
    ("shape", lambda t: t.update({SCALE: torch.ones(2, 1)}), "scales"),
    ("dtype", lambda t: t.update({SCALE: t[SCALE].double()}), "scales"),
    ("missing", lambda t: t.pop(SCALE), "has no"),
    ("nan-weight", lambda t: t[WEIGHT].view(torch.uint8).fill_(0x7F), "holds NaN"),
    ("3d", lambda t: t.update({WEIGHT: t[WEIGHT][None]}), "dims"),
]


@pytest.mark.parametrize(
    ("case", "edit", "message"), FP8_FORGERIES, ids=[f[0] for f in FP8_FORGERIES]
)
def test_forged_fp8_tensors_refused(
    case: str,
    edit: Callable[[dict[str, torch.Tensor]], None],
    message: str,
    hub_files: dict[str, Pair],
    tmp_path: Path,
) -> None:
    forged = _forge(hub_files["qwen3-fp8"][0], tmp_path / case, edit)
    with pytest.raises(ModelLoadError, match=message):
        load_model(forged)


def test_forged_mxfp4_and_unconfigured_float8_refused(
    hub_files: dict[str, Pair], tmp_path: Path
) -> None:
    scales = "model.layers.2.mlp.experts.down_proj_scales"
    nan = _forge(hub_files["gpt_oss-mxfp4"][0], tmp_path / "nan", lambda t: t[scales].fill_(255))
    with pytest.raises(ModelLoadError, match="NaN or overflow"):
        load_model(nan)
    blocks = "model.layers.2.mlp.experts.down_proj_blocks"
    cut = _forge(
        hub_files["gpt_oss-mxfp4"][0],
        tmp_path / "cut",
        lambda t: t.update({blocks: t[blocks][:, :, :1].clone()}),
    )
    with pytest.raises(ModelLoadError, match="has shape"):
        load_model(cut)
    floats = _forge(
        hub_files["gpt_oss-mxfp4"][0],
        tmp_path / "floats",
        lambda t: t.update({blocks: t[blocks].float()}),
    )
    with pytest.raises(ModelLoadError, match="expected uint8"):
        load_model(floats)
    no_config = tmp_path / "no-config"
    shutil.copytree(hub_files["qwen3-fp8"][0], no_config)
    config = json.loads((no_config / "config.json").read_text())
    del config["quantization_config"]
    (no_config / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelLoadError, match="float8 needs quantization_config"):
        load_model(no_config)
