"""Shared builders for engine acceptance tests: checkpoints, prompt sets, engines, references.

Checkpoints are built once per session (``tests/conftest.py``'s ``shared_checkpoints``) and transformers references are
memoised per (checkpoint, prompt, length), so many engine configurations can be checked against
one reference run.
"""

from __future__ import annotations

import functools
import json
import math
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from hybridkv import LLM, SamplingParams
from hybridkv.config import EngineConfig
from hybridkv.engine.core import EngineCore
from hybridkv.engine.output import RequestOutput
from tests.support.checkpoints import hf_model
from tests.support.lifetimes import track
from tests.support.prompts import random_ids as random_ids  # many tests import it from here

TOL = 1e-4  # |logit difference| allowed against transformers, float32
MAX_TOKENS = 8
SMALL_KV = "64MiB"


def make_prompt_set() -> list[list[int]]:
    """Ten prompts around the tiny models' limits (sliding window 32, mamba chunk 16).

    Several share prefixes (and one repeats another exactly), so requests that arrive later
    hit the prefix cache."""
    base = random_ids(100, 1)
    other = random_ids(45, 2)
    return [
        random_ids(5, 3),  # below the chunk and the window
        random_ids(20, 4),  # past one mamba chunk, inside the window
        other,  # past the window
        base,  # many blocks, chunks and windows
        random_ids(33, 5),  # just past the window
        base[:64] + random_ids(9, 6),  # a 64-token shared prefix
        list(base),  # an exact repeat: the hit stops one block short
        other[:37] + random_ids(30, 7),  # shares a prefix that ends inside a block
        base[:64] + random_ids(9, 6) + random_ids(20, 8),  # extends prompt 5
        random_ids(17, 9),  # one past a 16-token block
    ]


def greedy(max_tokens: int = MAX_TOKENS, **kw: Any) -> SamplingParams:
    """Greedy, stopping at eos as transformers' ``generate`` does."""
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, **kw)


def make_llm(model_dir: Path, **options: Any) -> LLM:
    opts: dict[str, Any] = {"dtype": "float32", "kv_cache_memory": SMALL_KV}
    opts.update(options)
    return track(LLM(model=str(model_dir), keep_logits=True, **opts))


def make_engine(model_dir: Path, **options: Any) -> EngineCore:
    opts: dict[str, Any] = {"dtype": "float32", "kv_cache_memory": SMALL_KV}
    opts.update(options)
    return track(EngineCore(EngineConfig.create(str(model_dir), **opts), keep_logits=True))


@functools.lru_cache(maxsize=512)
@torch.inference_mode()
def _reference(model_dir: Path, prompt: tuple[int, ...], n: int) -> tuple[list[int], torch.Tensor]:
    out = hf_model(model_dir).generate(
        torch.tensor([prompt]),
        max_new_tokens=n,
        do_sample=False,
        output_logits=True,
        return_dict_in_generate=True,
        pad_token_id=0,
    )
    return out.sequences[0, len(prompt) :].tolist(), torch.stack([s[0] for s in out.logits])


def hf_reference(model_dir: Path, prompt: list[int], n: int) -> tuple[list[int], torch.Tensor]:
    """transformers greedy ``generate``, stopping at eos as it does: up to ``n`` new ids and
    their raw logits ``[len(ids), V]`` (memoised)."""
    return _reference(Path(model_dir), tuple(prompt), n)


def eos_ids(model_dir: Path) -> set[int]:
    eos = hf_model(Path(model_dir)).generation_config.eos_token_id
    return set(eos if isinstance(eos, list) else [eos])


def assert_matches_hf(
    model_dir: Path, prompts: Sequence[list[int]], outs: Sequence[RequestOutput], what: str
) -> None:
    """Same greedy ids (and eos stop) as transformers and logits within ``TOL`` at every
    generated position."""
    assert len(outs) == len(prompts)
    for i, (prompt, out) in enumerate(zip(prompts, outs, strict=True)):
        n = len(out.token_ids)
        ref_ids, ref_logits = hf_reference(model_dir, prompt, MAX_TOKENS)
        assert out.token_ids == ref_ids, f"{what} prompt {i} (len {len(prompt)})"
        stopped = ref_ids[-1] in eos_ids(model_dir)
        assert out.finish_reason == ("stop" if stopped else "length"), f"{what} {out.error}"
        assert out.logits is not None and len(out.logits) == n
        diff = (torch.tensor(out.logits) - ref_logits).abs().max().item()
        assert diff < TOL, f"{what} prompt {i}: max |logit diff| {diff:.2e}"


def assert_no_leaks(engine: EngineCore) -> None:
    assert not engine.has_unfinished_requests()
    engine.kv.check_integrity()
    assert engine.kv.is_idle(), "blocks or state slots still held after every request finished"


def run_staggered(
    engine: EngineCore,
    prompts: Sequence[list[int]],
    params: SamplingParams | Sequence[SamplingParams],
    steps_between: int = 2,
    max_steps: int = 5000,
) -> list[RequestOutput]:
    """Add one request every ``steps_between`` steps while the earlier ones run (0: all at
    once); finish all.

    Returns the final output of each prompt, in prompt order."""
    per = [params] * len(prompts) if isinstance(params, SamplingParams) else list(params)
    pending = list(enumerate(prompts))
    order: dict[str, int] = {}
    final: dict[int, RequestOutput] = {}
    step = 0
    while pending or engine.has_unfinished_requests():
        assert step < max_steps, f"not finished after {max_steps} steps"
        while pending and (steps_between == 0 or step % steps_between == 0):
            i, prompt = pending.pop(0)
            order[engine.add_request(prompt, per[i]).request_id] = i
            if steps_between:
                break
        for out in engine.step():
            if out.finished:
                final[order[out.request_id]] = out
        step += 1
    return [final[i] for i in range(len(prompts))]


# -- broken checkpoints ------------------------------------------------------------------


def copy_checkpoint(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def edit_config(model_dir: Path, **changes: Any) -> None:
    path = model_dir / "config.json"
    config = json.loads(path.read_text())
    config.update(changes)
    path.write_text(json.dumps(config))


def edit_weights(model_dir: Path, name: str, new_shape: tuple[int, ...] | None) -> None:
    """Drop the tensor ``name`` (``new_shape=None``) or give it a different shape."""
    path = model_dir / "model.safetensors"
    tensors = load_file(str(path))
    old = tensors.pop(name)
    if new_shape is not None:
        tensors[name] = old.flatten()[: math.prod(new_shape)].reshape(new_shape).clone()
    save_file(tensors, str(path), {"format": "pt"})
