"""The compiled decode step (``model/compiled``) gives the Python step's numbers, bit for bit:
the same kernels, the same arguments, the same order. Each family's tiny checkpoint (float32
at GGUF sizes, so every projection is on the skinny kernel as in the Python step; GGUF Q8_0 /
Q4_K) decodes past the sliding window and carries Mamba2 states across steps, with the
program on and off."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from hybridkv.engine.core import EngineCore
from hybridkv.model.compiled.program import ENV_SWITCH, MAX_ROWS
from hybridkv.model.loading.hub import resolve_model_dir
from hybridkv.native.quant_blocks import QuantFormat
from tests.engine.helpers import (
    assert_no_leaks,
    greedy,
    make_engine,
    make_prompt_set,
    run_staggered,
)
from tests.engine.test_preemption import one_request_budget
from tests.model.conftest import make_runner
from tests.support.checkpoints import SharedCheckpoints
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


@pytest.mark.parametrize("arch", ARCHS)
def test_float32_program_matches_the_python_step(
    arch: str, gguf_sized: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    _assert_same(gguf_sized[arch], monkeypatch)


MIXED = {  # like llama.cpp's Q4_K_M: q/k/v of two formats (fused part by part), Q6_K embedding
    "token_embd": QuantFormat.Q6_K,
    "attn_v": QuantFormat.Q6_K,
    "ffn_down": QuantFormat.Q6_K,
    "": QuantFormat.Q4_K,
}


@pytest.mark.parametrize(
    "formats",
    [{"": QuantFormat.Q8_0}, {"": QuantFormat.Q4_K}, MIXED],
    ids=["Q8_0", "Q4_K", "mixed"],
)
@pytest.mark.parametrize("arch", ARCHS)
def test_gguf_program_matches_the_python_step(
    arch: str,
    formats: dict[str, QuantFormat],
    gguf_sized: dict[str, Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    path = make_gguf_checkpoint(arch, gguf_sized[arch], tmp_path / "m.gguf", formats)
    _assert_same(resolve_model_dir(str(path)), monkeypatch)


def test_a_rotary_table_that_grows_replans_the_program(
    gguf_sized: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A step past the rotary tables runs in Python (which grows them); the program is then
    planned again on the new tables, and every step keeps the Python step's numbers."""
    drivers = []
    for program in (False, True):
        monkeypatch.setenv(ENV_SWITCH, "1" if program else "0")
        driver = RunnerDriver(make_runner(gguf_sized["gemma3"]))
        model = driver.runner.model
        for table in (model.rotary_global, model.rotary_local):
            table._grow(23)  # positions [0, 23): the decode below passes it
        driver.add("a", list(range(3, 23)))
        driver.step({"a": 20})
        driver.decode_all(["a"], 3)  # positions 20..22 on the first program
        first = driver.runner.decode_program.program
        driver.decode_all(["a"], 3)  # 23 grows the tables in Python; 24, 25 on a new program
        drivers.append(driver)
    again = drivers[1].runner.decode_program.program
    assert first is not None and again is not None and again is not first
    assert first.num_steps == 3 and again.num_steps == 2
    assert torch.equal(drivers[0].all_logits("a"), drivers[1].all_logits("a"))


@pytest.mark.parametrize(
    ("arch", "overrides", "reason"),
    [
        ("granitemoehybrid_moe", {}, "MoE experts"),  # routing in torch
        ("gemma3", {}, "runs on F.linear"),  # the tiny sizes: weights below the skinny kernel's
    ],
)
def test_a_model_it_cannot_express_decodes_in_python_and_says_why(
    arch: str,
    overrides: dict[str, object],
    reason: str,
    shared_checkpoints: SharedCheckpoints,
    caplog: pytest.LogCaptureFixture,
) -> None:
    driver = RunnerDriver(make_runner(shared_checkpoints.get(arch, **overrides)))
    driver.add("a", [3, 4, 5])
    with caplog.at_level("INFO", logger="hybridkv.model.compiled.program"):
        driver.step({"a": 3})
        driver.decode_all(["a"], 2)
    assert driver.runner.decode_program.program is None
    assert len(driver.requests["a"].output) == 3
    assert caplog.text.count("decode program off") == 1 and reason in caplog.text


def test_bfloat16_activations_decode_in_python(
    gguf_sized: dict[str, Path], caplog: pytest.LogCaptureFixture
) -> None:
    driver = RunnerDriver(make_runner(gguf_sized["gemma3"], dtype="bfloat16"))
    driver.add("a", [3, 4, 5])
    with caplog.at_level("INFO", logger="hybridkv.model.compiled.program"):
        driver.step({"a": 3})
        driver.decode_all(["a"], 1)
    assert driver.runner.decode_program.program is None and "bfloat16" in caplog.text


def _engine_run(
    model_dir: Path, program: bool, budget: int | None, monkeypatch: pytest.MonkeyPatch
) -> tuple[EngineCore, list]:
    monkeypatch.setenv(ENV_SWITCH, "1" if program else "0")
    opts: dict[str, object] = {"max_model_len": 136, "enable_prefix_caching": True}
    if budget is not None:
        opts["kv_cache_memory"] = budget
    engine = make_engine(model_dir, **opts)
    params = [greedy(32, ignore_eos=True)] * 10
    prompts = make_prompt_set()  # shared prefixes, an exact repeat
    return engine, run_staggered(engine, prompts, params, steps_between=1)


@pytest.mark.parametrize("arch", ["gemma3", "granitemoehybrid"])
def test_prefix_hits_and_preemption_keep_the_python_steps_outputs(
    arch: str, gguf_sized: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through the engine: prefix-cache hits (state checkpoints restored into live slots) and
    preemption (recomputed requests) with the program on give the program-off run's ids and
    logits exactly."""
    free, _ = _engine_run(gguf_sized[arch], True, None, monkeypatch)
    budget = one_request_budget(free)
    runs = [_engine_run(gguf_sized[arch], p, budget, monkeypatch) for p in (False, True)]
    (python, ref), (compiled, outs) = runs
    assert compiled.runner.decode_program.program is not None
    assert compiled.runner.decode_program.program.num_steps > 20
    assert compiled.scheduler.num_preemptions > 0
    assert compiled.scheduler.num_preemptions == python.scheduler.num_preemptions
    assert any(out.num_cached_tokens > 0 for out in outs)  # prefix hits
    for out, expected in zip(outs, ref, strict=True):
        assert out.token_ids == expected.token_ids and out.logits == expected.logits
    assert_no_leaks(compiled)


@pytest.mark.parametrize("arch", ["gemma3", "granitemoehybrid"])
def test_a_full_batch_of_decode_rows_matches_the_python_step(
    arch: str, gguf_sized: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``MAX_ROWS`` requests decoding together (B1's 32), then one more: Python again."""
    logits = []
    for program in (False, True):
        monkeypatch.setenv(ENV_SWITCH, "1" if program else "0")
        driver = RunnerDriver(make_runner(gguf_sized[arch], num_state_slots=MAX_ROWS + 2))
        rids = [f"r{i}" for i in range(MAX_ROWS + 1)]
        for i, rid in enumerate(rids):
            driver.add(rid, [3 + i, 7, 11 + 2 * i, 5])
        driver.step(dict.fromkeys(rids, 4))
        driver.decode_all(rids[:MAX_ROWS], 2)  # on the program
        driver.decode_all(rids, 1)  # one row too many: the Python step
        steps = driver.runner.decode_program.program
        assert (steps.num_steps if steps else 0) == (2 if program else 0)
        logits.append(torch.cat([driver.all_logits(rid) for rid in rids]))
    assert torch.equal(logits[0], logits[1])
