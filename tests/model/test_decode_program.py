"""The compiled decode step (``model/compiled``) gives the Python step's numbers, bit for bit:
the same kernels, the same arguments, the same order. Each family's tiny checkpoint (float32
at GGUF sizes, so every projection is on the skinny kernel as in the Python step; GGUF Q8_0 /
Q4_K) decodes past the sliding window and carries Mamba2 states across steps, with the
program on and off."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from hybridkv.model.compiled.program import ENV_SWITCH
from hybridkv.model.loading.hub import resolve_model_dir
from hybridkv.native.quant_blocks import QuantFormat
from tests.model.conftest import make_runner
from tests.support.driver import RunnerDriver
from tests.support.gguf_checkpoints import make_gguf_checkpoint, make_gguf_hf_checkpoint

ARCHS = ("gemma3", "granitemoehybrid", "qwen3")
PROMPTS = {"a": list(range(3, 23)), "b": list(range(40, 68)), "c": [5, 9, 2]}
DECODE_STEPS = 12  # b passes position 32 (the tiny sliding window) and its block edge


@pytest.fixture(scope="module")
def gguf_sized(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("decode-program")
    return {arch: make_gguf_hf_checkpoint(arch, root / arch) for arch in ARCHS}


def _decode(model_path: Path, program: bool, monkeypatch: pytest.MonkeyPatch) -> RunnerDriver:
    if program:
        monkeypatch.delenv(ENV_SWITCH, raising=False)
    else:
        monkeypatch.setenv(ENV_SWITCH, "0")
    driver = RunnerDriver(make_runner(model_path))
    for rid, prompt in PROMPTS.items():
        driver.add(rid, prompt)
    driver.step({rid: len(p) for rid, p in PROMPTS.items()})
    driver.decode_all(list(PROMPTS), DECODE_STEPS // 2)  # 3 rows a step
    driver.decode_all(["b"], DECODE_STEPS // 2)  # 1 row a step
    return driver


def _assert_same(model_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    python = _decode(model_path, False, monkeypatch)
    assert python.runner.decode_program.program is None
    compiled = _decode(model_path, True, monkeypatch)
    program = compiled.runner.decode_program.program
    assert program is not None and program.num_steps == DECODE_STEPS
    for rid in PROMPTS:
        ours, ref = compiled.requests[rid], python.requests[rid]
        assert ours.output == ref.output, rid
        assert torch.equal(compiled.all_logits(rid), python.all_logits(rid)), rid


@pytest.mark.slow
@pytest.mark.parametrize("arch", ARCHS)
def test_float32_program_matches_the_python_step(
    arch: str, gguf_sized: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    _assert_same(gguf_sized[arch], monkeypatch)


@pytest.mark.slow
@pytest.mark.parametrize("fmt", [QuantFormat.Q8_0, QuantFormat.Q4_K])
@pytest.mark.parametrize("arch", ["gemma3", "granitemoehybrid"])
def test_gguf_program_matches_the_python_step(
    arch: str,
    fmt: QuantFormat,
    gguf_sized: dict[str, Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    path = make_gguf_checkpoint(arch, gguf_sized[arch], tmp_path / "m.gguf", {"": fmt})
    _assert_same(resolve_model_dir(str(path)), monkeypatch)
