"""Bad input on the command line: ``hybridkv: error: ...`` naming the problem, a non-zero
exit, no traceback; in a prompts file, one bad prompt does not take the others down."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.cli.helpers import assert_clean_error, json_records, run_cli, write_prompts_file
from tests.engine.helpers import (
    MAX_TOKENS,
    copy_checkpoint,
    edit_config,
    edit_weights,
    hf_reference,
    random_ids,
)


def generate(model_dir: Path | str, *args: str | int | Path) -> list[str | Path]:
    return ["generate", "--model", model_dir, "--dtype", "float32", *map(str, args)]


def test_missing_model_directory(tmp_path: Path) -> None:
    proc = run_cli(*generate(tmp_path / "nope", "--prompt", "hi"))
    assert_clean_error(proc, "does not exist")


def test_unsupported_architecture(checkpoints: dict[str, Path], tmp_path: Path) -> None:
    model_dir = copy_checkpoint(checkpoints["qwen3"], tmp_path / "m")
    edit_config(model_dir, architectures=["LlamaForCausalLM"])
    assert_clean_error(run_cli(*generate(model_dir, "--prompt", "hi")), "LlamaForCausalLM")


def test_mis_shaped_weights(checkpoints: dict[str, Path], tmp_path: Path) -> None:
    model_dir = copy_checkpoint(checkpoints["granitemoehybrid"], tmp_path / "m")
    edit_weights(model_dir, "model.embed_tokens.weight", (1000, 64))
    proc = run_cli(*generate(model_dir, "--prompt", "hi"))
    assert_clean_error(proc, "'model.embed_tokens.weight' has shape (1000, 64)")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--temperature", "-1"], "invalid sampling parameter temperature=-1.0"),
        (["--max-tokens", "0"], "invalid sampling parameter max_tokens=0"),
        (["--block-size", "0"], "invalid engine option block_size=0"),
        (["--kv-cache-memory", "1KiB"], "kv_cache_memory=1024 bytes"),
        (["--kv-cache-size", "1GiB"], "unrecognized arguments: --kv-cache-size"),
        (["--max-model-len", "4"], "does not fit max_model_len=4"),
    ],
)
def test_bad_options_and_prompts(
    args: list[str], message: str, checkpoints: dict[str, Path]
) -> None:
    prompt = "the cache is a block of memory in a model"  # more than 4 tokens
    proc = run_cli(*generate(checkpoints["qwen3"], "--prompt", prompt, *args))
    assert_clean_error(proc, message)


def test_malformed_prompts_file_names_the_line(
    checkpoints: dict[str, Path], tmp_path: Path
) -> None:
    path = tmp_path / "p.jsonl"
    path.write_text('{"prompt": "hi"}\n{"prompt_token_ids": ["x"]}\n')
    proc = run_cli(*generate(checkpoints["qwen3"], "--prompts-file", path))
    assert_clean_error(proc, f"{path}:2")


def test_bad_prompts_fail_alone(checkpoints: dict[str, Path], tmp_path: Path) -> None:
    model_dir = checkpoints["granitemoehybrid"]
    good = [random_ids(12, 70), random_ids(40, 71)]
    prompts = [good[0], [5, 1024, 6], random_ids(70, 72), good[1]]
    path = write_prompts_file(tmp_path / "p.jsonl", prompts)
    proc = run_cli(
        *generate(model_dir, "--prompts-file", path, "--json", "--max-model-len", 64,
                  "--max-tokens", MAX_TOKENS, "--kv-cache-memory", "64MiB")
    )  # fmt: skip
    assert_clean_error(proc, "token ids [1024] outside the vocabulary")
    assert "does not fit max_model_len=64" in proc.stderr
    records = json_records(proc.stdout)
    assert [r["finish_reason"] for r in records][1:3] == ["error", "error"]
    assert "outside the vocabulary" in records[1]["error"]
    for rec, prompt in zip([records[0], records[3]], good, strict=True):
        assert rec["token_ids"] == hf_reference(model_dir, prompt, MAX_TOKENS)[0]
        assert "error" not in rec


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--max-request-bytes", "0"], "invalid --max-request-bytes"),
        (["--max-queued-requests", "0"], "--max-queued-requests must be an integer >= 1"),
        (["--engine-stall-seconds", "nan"], "--engine-stall-seconds must be a finite number"),
        (["--api-key", "k", "--api-key-file", "f"], "give --api-key or --api-key-file"),
        (["--state-checkpoint-budget", "0"], "state_checkpoint_budget=0.0: must be a fraction"),
        (["--state-checkpoint-budget", "1.5"], "state_checkpoint_budget=1.5: must be a fraction"),
        (["--state-checkpoint-budget", "nan"], "state_checkpoint_budget=nan: must be a fraction"),
    ],
)
def test_bad_serve_limits_fail_before_the_model_loads(args: list[str], message: str) -> None:
    assert_clean_error(run_cli("serve", "--port", "1", *args), message)
