"""lm-eval's ``local-completions`` model against a real ``hybridkv serve``, on two local tasks
(JSONL in ``data/``): a multiple-choice task (loglikelihood requests: ``echo`` + ``logprobs``
over token-id prompts, several per request) and a generate-until task. The loglikelihoods lm-eval
reports equal the ones ``LLM.generate(prompt_logprobs=...)`` gives for the same tokens."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.server.harness import SubprocessServer

pytestmark = pytest.mark.slow

DATA = Path(__file__).parent / "data"
NAME = "tiny"
ENGINE = ["--kv-cache-memory", "64MiB", "--max-num-seqs", "16", "--seed", "0"]
MC_TASK = """\
task: hybridkv_mc
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{question}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: label
metric_list:
  - metric: acc
metadata:
  version: 1.0
"""
GEN_TASK = """\
task: hybridkv_gen
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: generate_until
doc_to_text: "{{{{question}}}}"
doc_to_target: "{{{{answer}}}}"
generation_kwargs:
  until: ["\\n"]
  max_gen_toks: 8
  do_sample: false
  temperature: 0
metric_list:
  - metric: exact_match
metadata:
  version: 1.0
"""


@pytest.fixture(scope="module")
def server(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SubprocessServer]:
    log = tmp_path_factory.mktemp("server") / "server.log"
    args = [str(model_dir), "--served-model-name", NAME, *ENGINE]
    with SubprocessServer(args, log) as srv:
        yield srv


def run_lm_eval(server: SubprocessServer, model_dir: Path, out: Path) -> None:
    if importlib.util.find_spec("lm_eval") is None:
        pytest.skip("lm-eval is not installed (pip install -e '.[eval]')")
    tasks = out / "tasks"
    tasks.mkdir(parents=True)
    (tasks / "mc.yaml").write_text(MC_TASK.format(data=DATA / "lm_eval_mc.jsonl"))
    (tasks / "gen.yaml").write_text(GEN_TASK.format(data=DATA / "lm_eval_gen.jsonl"))
    model_args = ",".join([
        f"base_url={server.url}/v1/completions",
        f"model={NAME}",
        "tokenizer_backend=huggingface",
        f"tokenizer={model_dir}",
        "tokenized_requests=True",  # token-id prompts...
        "num_concurrent=1",
        "max_retries=1",
    ])  # fmt: skip
    cmd = [sys.executable, "-m", "lm_eval", "--model", "local-completions"]
    cmd += ["--model_args", model_args, "--include_path", str(tasks)]
    cmd += ["--tasks", "hybridkv_mc,hybridkv_gen", "--output_path", str(out / "out")]
    cmd += ["--log_samples", "--batch_size", "4"]  # several token-id prompts per request
    offline = {"HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "HF_HOME": str(out / "hf")}
    done = subprocess.run(
        cmd, env={**os.environ, **offline}, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


def samples(out: Path, task: str) -> list[dict[str, Any]]:
    text = next((out / "out").rglob(f"samples_{task}_*.jsonl")).read_text()
    return [json.loads(line) for line in text.splitlines()]


def encode_pair(tok: Any, context: str, continuation: str) -> tuple[list[int], int]:
    """lm-eval's ``_encode_pair``: trailing spaces move to the continuation; the continuation's
    tokens are the whole text's past the context's."""
    n_spaces = len(context) - len(context.rstrip())
    if n_spaces:
        continuation, context = context[-n_spaces:] + continuation, context[:-n_spaces]
    whole = tok.encode(context + continuation, add_special_tokens=False)
    ctx = tok.encode(context, add_special_tokens=False)
    return ctx + whole[len(ctx) :], len(ctx)


def test_lm_eval_both_task_kinds(server: SubprocessServer, model_dir: Path, tmp_path: Path) -> None:
    from hybridkv import LLM, SamplingParams

    run_lm_eval(server, model_dir, tmp_path)
    results = json.loads(next((tmp_path / "out").rglob("results_*.json")).read_text())
    assert 0.0 <= results["results"]["hybridkv_mc"]["acc,none"] <= 1.0
    assert 0.0 <= results["results"]["hybridkv_gen"]["exact_match,none"] <= 1.0
    assert len(samples(tmp_path, "hybridkv_gen")) == 3
    mc = samples(tmp_path, "hybridkv_mc")
    assert len(mc) == 3
    llm = LLM(str(model_dir), kv_cache_memory="64MiB", max_num_seqs=16, seed=0)
    tok = llm.get_tokenizer()
    params = SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=1)
    for sample in mc:
        for args, resp in zip(sample["arguments"].values(), sample["resps"], strict=True):
            ids, ctxlen = encode_pair(tok, args["arg_0"], args["arg_1"])
            ref = llm.generate([ids], params, use_tqdm=False)[0].prompt_logprobs
            want = sum(ref[i][ids[i]].logprob for i in range(ctxlen, len(ids)))
            got = float(resp[0][0])  # lm-eval logs numbers as text
            assert math.isclose(got, want, abs_tol=1e-5), (args, got, want)
