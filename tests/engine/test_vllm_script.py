"""A script written for vLLM (its quickstart, logprobs and n use) runs with only the import
line changed (and the model path: a tiny local checkpoint)."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

VLLM_SCRIPT = """
from vllm import LLM, SamplingParams

prompts = [
    "Hello, my name is",
    "The president of the United States is",
    "The capital of France is",
    "The future of AI is",
]
sampling_params = SamplingParams(temperature=0.8, top_p=0.95)

llm = LLM(model=MODEL)
outputs = llm.generate(prompts, sampling_params)
for output in outputs:
    prompt = output.prompt
    generated_text = output.outputs[0].text
    print(f"Prompt: {prompt!r}, Generated text: {generated_text!r}")

params = SamplingParams(temperature=0, max_tokens=8, logprobs=5, prompt_logprobs=2)
outputs = llm.generate(prompts[:1], params)
completion = outputs[0].outputs[0]
for i, token_id in enumerate(completion.token_ids):
    logprob = completion.logprobs[i][token_id].logprob
    best = min(completion.logprobs[i].values(), key=lambda lp: lp.rank)
    assert best.rank == 1 and logprob <= best.logprob <= 0
    print(i, token_id, round(logprob, 3), repr(best.decoded_token))
assert len(completion.logprobs[0]) in (5, 6)
print("cumulative", completion.cumulative_logprob)
assert outputs[0].prompt_logprobs[0] is None
print("prompt", len(outputs[0].prompt_logprobs))

outputs = llm.generate(prompts[0], SamplingParams(n=3, seed=0, max_tokens=5))
assert [c.index for c in outputs[0].outputs] == [0, 1, 2]
print("n", [c.text for c in outputs[0].outputs])
"""


def test_a_vllm_script_runs_with_only_the_import_changed(checkpoints: dict[str, Path]) -> None:
    script = VLLM_SCRIPT.replace("from vllm import", "from hybridkv import")
    assert script.count("hybridkv") == 1  # nothing else changed
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(script, "vllm_script.py", "exec"), {"MODEL": str(checkpoints["qwen3"])})
    lines = printed.getvalue().splitlines()
    assert sum(line.startswith("Prompt: ") for line in lines) == 4
    assert any(line.startswith("cumulative ") for line in lines)
    assert any(line.startswith("n [") for line in lines)
