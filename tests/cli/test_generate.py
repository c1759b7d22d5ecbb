"""``hybridkv generate --json`` equals transformers and reports the prefix-cache hits the rules
give; ``hybridkv make-model`` checkpoints load in transformers and generate the same tokens;
the embedded default model is built once."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.cli.helpers import json_records, run_cli, write_prompts_file
from tests.engine.helpers import (
    MAX_TOKENS,
    assert_matches_hf,
    eos_ids,
    greedy,
    hf_reference,
    make_llm,
    make_prompt_set,
    random_ids,
)
from tests.support.cache_dirs import private_cache
from tests.support.checkpoints import HF_ARCHS

PROMPTS = make_prompt_set()
HAS_STATE = {"granitemoehybrid", "granitemoehybrid_moe"}


def expected_hits(arch: str) -> list[int]:
    """Cached prompt tokens when the prompts run one at a time (block size 16, see
    ``make_prompt_set``): 5 shares 64 tokens with 3 (a state group has no checkpoint there
    yet), 6 repeats 3 (capped at N-1 = 99 -> 96), 7 shares 37 tokens with 2 (32 in whole
    blocks, 2's last prompt boundary), 8 extends 5's prompt (5's last prompt boundary, 64)."""
    at_64 = 0 if arch in HAS_STATE else 64
    return [0, 0, 0, 0, 0, at_64, 96, 32, 64, 0]


@pytest.mark.parametrize("arch", HF_ARCHS)
def test_generate_json_matches_transformers(
    arch: str, checkpoints: dict[str, Path], tmp_path: Path
) -> None:
    model_dir = checkpoints[arch]
    prompts_file = write_prompts_file(tmp_path / "prompts.jsonl", PROMPTS)
    proc = run_cli(
        "generate", "--model", model_dir, "--prompts-file", prompts_file, "--json",
        "--max-tokens", MAX_TOKENS, "--dtype", "float32", "--kv-cache-memory", "64MiB",
        "--max-num-seqs", 1,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    records = json_records(proc.stdout)
    assert len(records) == len(PROMPTS)
    for i, (prompt, rec) in enumerate(zip(PROMPTS, records, strict=True)):
        ref_ids, _ = hf_reference(model_dir, prompt, MAX_TOKENS)
        assert rec["token_ids"] == ref_ids, f"prompt {i}"
        stopped = ref_ids[-1] in eos_ids(model_dir)
        assert rec["finish_reason"] == ("stop" if stopped else "length")
        assert rec["prompt_tokens"] == len(prompt)
        assert "error" not in rec
    assert [rec["cached_tokens"]["local"] for rec in records] == expected_hits(arch)


@pytest.mark.parametrize("arch", ["qwen3", "gemma3", "granitemoehybrid"])
def test_make_model_checkpoint_loads_in_transformers_and_agrees(arch: str, tmp_path: Path) -> None:
    out = tmp_path / arch
    proc = run_cli("make-model", "--arch", arch, "--out", out, "--seed", 3)
    assert proc.returncode == 0, proc.stderr
    assert str(out) in proc.stdout
    prompts = [random_ids(5, 60), random_ids(40, 61), random_ids(70, 62)]
    llm = make_llm(out)
    outs = llm.generate(prompts, greedy(), use_tqdm=False)
    assert_matches_hf(out, prompts, outs, f"make-model {arch}")  # loads with transformers


def test_default_model_is_built_once(tmp_path: Path) -> None:
    env = {"HYBRIDKV_CACHE_DIR": str(private_cache(tmp_path / "cache"))}  # only the model new
    notice = "created the embedded default model"
    first = run_cli("generate", "--prompt", "hi", "--max-tokens", 4, env=env)
    assert first.returncode == 0, first.stderr
    assert first.stderr.count(notice) == 1
    assert first.stdout.startswith("'hi' -> ")
    second = run_cli("generate", "--prompt", "hi", "--max-tokens", 4, env=env)
    assert second.returncode == 0, second.stderr
    assert notice not in second.stderr
    assert second.stdout == first.stdout  # greedy: the same model, the same text
    (model_dir,) = [p for p in (tmp_path / "cache").iterdir() if p.name != "native"]
    assert (model_dir / "config.json").is_file()
