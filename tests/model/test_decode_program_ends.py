"""The decode program's ends (``model/compiled/embed.py``, ``head.py``): the embedding lookup
inside the program (every program test's logits check it too) and the greedy head, which
picks each plain-greedy step's tokens without logits in Python. Greedy outputs stay
token-identical with the program on and off; a step with a sampled request, logprobs or
kept logits gets its logits from Python; a row whose logits have no finite maximum fails
as the Python step fails it."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from hybridkv.model.compiled.program import ENV_SWITCH
from hybridkv.model.loading.hub import resolve_model_dir
from hybridkv.native.quant_blocks import QuantFormat
from hybridkv.sampling.params import SamplingParams
from tests.model.conftest import make_runner
from tests.model.test_decode_program import ARCHS, MIXED, gguf_sized  # noqa: F401 (fixture)
from tests.support.driver import RunnerDriver
from tests.support.gguf_checkpoints import make_gguf_checkpoint

PROMPTS = {"a": list(range(3, 23)), "b": list(range(40, 68)), "c": [5, 9, 2]}
SAMPLED = SamplingParams(temperature=0.8, seed=7, max_tokens=64)


def _decode(
    model_path: Path, program: bool, monkeypatch: pytest.MonkeyPatch, sampled: bool = False
) -> RunnerDriver:
    monkeypatch.setenv(ENV_SWITCH, "1" if program else "0")
    driver = RunnerDriver(make_runner(model_path, keep_logits=False), all_logits=False)
    for rid, prompt in PROMPTS.items():
        driver.add(rid, prompt, SAMPLED if sampled and rid == "c" else driver_greedy())
    driver.step({rid: len(p) for rid, p in PROMPTS.items()})
    driver.decode_all(list(PROMPTS), 6)  # 3 rows a step (one sampled with ``sampled``)
    driver.decode_all(["b"], 6)  # 1 row a step: greedy
    return driver


def driver_greedy() -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=64)


def _outputs(driver: RunnerDriver) -> dict[str, list[int]]:
    return {rid: r.output for rid, r in driver.requests.items()}


@pytest.mark.parametrize(
    "formats", [None, {"": QuantFormat.Q8_0}, MIXED], ids=["F32", "Q8_0", "Q4_K_M-like"]
)
@pytest.mark.parametrize("arch", ARCHS)
def test_the_greedy_head_gives_the_python_steps_tokens(
    arch: str,
    formats: dict[str, QuantFormat] | None,
    gguf_sized: dict[str, Path],  # noqa: F811
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    path = gguf_sized[arch]
    if formats is not None:
        gguf = make_gguf_checkpoint(arch, path, tmp_path / "m.gguf", formats)
        path = resolve_model_dir(str(gguf))
    python = _decode(path, False, monkeypatch)
    compiled = _decode(path, True, monkeypatch)
    program = compiled.runner.decode_program.program
    assert program is not None and program.ends.embeds and program.ends.head is not None
    assert program.num_head_steps == program.num_steps == 12
    assert _outputs(compiled) == _outputs(python)
    assert len(set(map(tuple, _outputs(python).values()))) == 3  # the rows' tokens differ


def test_a_step_with_a_sampled_request_gets_its_logits_from_python(
    gguf_sized: dict[str, Path],  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    python = _decode(gguf_sized["granitemoehybrid"], False, monkeypatch, sampled=True)
    compiled = _decode(gguf_sized["granitemoehybrid"], True, monkeypatch, sampled=True)
    program = compiled.runner.decode_program.program
    assert program is not None and program.num_steps == 12
    assert program.num_head_steps == 6  # the 1-row greedy steps only
    assert _outputs(compiled) == _outputs(python)


def test_kept_logits_and_logprobs_come_from_python(
    gguf_sized: dict[str, Path],  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(ENV_SWITCH, raising=False)
    kept = RunnerDriver(make_runner(gguf_sized["qwen3"]), all_logits=False)  # keep_logits
    asks = RunnerDriver(make_runner(gguf_sized["qwen3"], keep_logits=False), all_logits=False)
    asks_params = SamplingParams(temperature=0.0, max_tokens=64, logprobs=2)
    kept.add("a", [3, 4, 5])
    asks.add("a", [3, 4, 5], asks_params)
    results = []
    for driver in (kept, asks):
        driver.step({"a": 3})
        results.append(driver.step({"a": 1}))
        program = driver.runner.decode_program.program
        assert program is not None and program.num_steps == 1 and program.num_head_steps == 0
    assert len(results[0].logits["a"]) == kept.runner.model.lm_head.out_features
    assert results[1].logprobs["a"] is not None
    assert kept.requests["a"].output == asks.requests["a"].output


def test_a_row_without_a_finite_maximum_fails_as_in_python(
    gguf_sized: dict[str, Path],  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A NaN logit (numerically broken weights): the head reports the row, Python computes the
    logits and the request fails with the Python step's error."""
    errors = []
    for program in (False, True):
        monkeypatch.setenv(ENV_SWITCH, "1" if program else "0")
        runner = make_runner(gguf_sized["qwen3"], keep_logits=False)
        driver = RunnerDriver(runner, all_logits=False)
        driver.add("a", [3, 4, 5])
        driver.step({"a": 3})
        driver.step({"a": 1})
        with torch.no_grad():
            runner.model.lm_head.weight[50] = float("nan")  # a token no step reads
        errors.append(driver.step({"a": 1}).errors)
        steps = runner.decode_program.program
        assert (steps.num_head_steps if steps else 0) == 2 * int(program)
    assert errors[0] == errors[1] and "non-finite" in errors[0]["a"]
