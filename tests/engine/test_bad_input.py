"""Bad input gets a clear error naming the problem; in a batch, one bad request fails alone."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from hybridkv import LLM, SamplingParams
from tests.engine.helpers import (
    assert_matches_hf,
    assert_no_leaks,
    copy_checkpoint,
    edit_config,
    edit_weights,
    greedy,
    make_llm,
    random_ids,
)

# -- the model directory ---------------------------------------------------------------


def test_missing_model_directory(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"model directory .*nope.* does not exist"):
        LLM(model=str(tmp_path / "nope"))


def test_unsupported_architecture(checkpoints: dict[str, Path], tmp_path: Path) -> None:
    model_dir = copy_checkpoint(checkpoints["qwen3"], tmp_path / "m")
    edit_config(model_dir, architectures=["LlamaForCausalLM"])
    with pytest.raises(ValueError, match="unsupported architecture.*LlamaForCausalLM"):
        make_llm(model_dir)


def test_missing_weight_is_named(checkpoints: dict[str, Path], tmp_path: Path) -> None:
    model_dir = copy_checkpoint(checkpoints["granitemoehybrid"], tmp_path / "m")
    edit_weights(model_dir, "model.layers.0.mamba.in_proj.weight", None)
    with pytest.raises(ValueError, match=r"model\.layers\.0\.mamba\.in_proj\.weight.*missing"):
        make_llm(model_dir)


def test_mis_shaped_weight_is_named(checkpoints: dict[str, Path], tmp_path: Path) -> None:
    model_dir = copy_checkpoint(checkpoints["qwen3"], tmp_path / "m")
    edit_weights(model_dir, "model.layers.1.self_attn.q_proj.weight", (32, 64))
    with pytest.raises(ValueError, match=r"q_proj\.weight.*shape \(32, 64\), expected \(64, 64\)"):
        make_llm(model_dir)


def test_missing_weights_file(checkpoints: dict[str, Path], tmp_path: Path) -> None:
    model_dir = copy_checkpoint(checkpoints["gemma3"], tmp_path / "m")
    (model_dir / "model.safetensors").unlink()
    with pytest.raises(ValueError, match="no model.safetensors"):
        make_llm(model_dir)


# -- engine options ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"max_num_seq": 4}, "unknown engine option 'max_num_seq'"),
        ({"block_size": 0}, "block_size=0"),
        ({"dtype": "float16"}, "dtype='float16': float16 is not supported on CPU"),
        ({"kv_cache_memory": "lots"}, "kv_cache_memory 'lots'"),
        ({"state_checkpoint_interval": 20}, "state_checkpoint_interval=20"),
        ({"max_num_seqs": float("nan")}, "max_num_seqs=nan: must be an integer"),
        ({"block_size": True}, "block_size=True: must be an integer"),
        ({"max_model_len": 64.5}, "max_model_len=64.5: must be an integer"),
        ({"seed": 1.5}, "seed=1.5: must be an integer"),
    ],
)
def test_bad_engine_option_is_named(
    options: dict[str, Any], named: str, checkpoints: dict[str, Path]
) -> None:
    with pytest.raises(ValueError, match=named):
        make_llm(checkpoints["qwen3"], **options)


# -- sampling parameters -----------------------------------------------------------------


@pytest.mark.parametrize(
    "params",
    [
        {"temperature": -1},
        {"top_p": 0},
        {"top_p": 1.5},
        {"max_tokens": 0},
        {"top_k": -2},
        {"stop": [""]},
        {"stop_token_ids": [-1]},
        # hostile values (issue 18): non-finite numbers, bools as ints, huge stop lists
        {"temperature": float("inf")},
        {"temperature": float("nan")},
        {"top_p": float("nan")},
        {"max_tokens": True},
        {"max_tokens": 2.0},
        {"top_k": True},
        {"seed": 1.5},
        {"logprobs": -1},
        {"logprobs": 1.5},
        {"n": 0},
        {"min_p": 1.5},
        {"presence_penalty": 3.0},
        {"repetition_penalty": 0.0},
        {"min_tokens": 17},
        {"logit_bias": {"x": 1.0}},
        {"allowed_token_ids": []},
        {"bad_words": [""]},
        {"truncate_prompt_tokens": 0},
        {"prompt_logprobs": -2},
        {"stop": ["x"] * 300_000},
        {"stop": ["x" * 5000]},
        {"stop_token_ids": list(range(2000))},
    ],
)
def test_invalid_sampling_parameter_is_named(params: dict[str, Any]) -> None:
    (name,) = params
    with pytest.raises(ValueError, match=f"invalid sampling parameter {name}=") as info:
        SamplingParams(**params)
    assert len(str(info.value)) < 300  # a hostile value is not echoed whole


def test_tiny_temperatures_are_greedy_or_raised_like_vllm() -> None:
    assert SamplingParams(temperature=1e-40).greedy  # 1e-40 once sampled token 0 every time
    assert SamplingParams(temperature=1e-6).temperature == 0.0
    assert SamplingParams(temperature=1e-3).temperature == 1e-2  # no overflow to inf
    assert SamplingParams(temperature=0.7).temperature == 0.7


# -- one bad request in a batch ----------------------------------------------------------


def test_bad_requests_fail_alone_in_a_batch(checkpoints: dict[str, Path]) -> None:
    model_dir = checkpoints["granitemoehybrid"]
    llm = make_llm(model_dir, max_model_len=64)
    good = [random_ids(10, 30), random_ids(40, 31), random_ids(25, 32)]
    bad: dict[int, tuple[Any, str]] = {
        1: (random_ids(64, 33), "64 tokens does not fit max_model_len=64"),
        3: ([5, 6, 1024, 7], r"token ids \[1024\] outside the vocabulary \[0, 1024\)"),
        4: ([5, -1], r"token ids \[-1\] outside the vocabulary"),
        6: ([], "the prompt is empty"),
        7: ({"text": "hi"}, "a prompt dict needs 'prompt' or 'prompt_token_ids'"),
        8: ("lone \ud800 surrogate", "not valid Unicode: a lone surrogate U\\+D800"),
        9: ({"prompt": "hi", "cache_salt": ""}, "cache_salt must be a non-empty string"),
    }
    batch: list[Any] = []
    good_at = []
    for i in range(len(good) + len(bad)):
        if i in bad:
            batch.append(bad[i][0])
        else:
            good_at.append(i)
            batch.append(good[len(good_at) - 1])
    outs = llm.generate(batch, greedy(), use_tqdm=False)
    for i, (_, message) in bad.items():
        assert outs[i].finish_reason == "error"
        assert outs[i].token_ids == []
        assert outs[i].error is not None
        assert re.search(message, outs[i].error), (i, outs[i].error)
    assert_matches_hf(model_dir, good, [outs[i] for i in good_at], "batch with bad requests")
    assert_no_leaks(llm.engine)


def test_a_long_running_engine_does_not_accumulate_kv_events(
    checkpoints: dict[str, Path],
) -> None:
    """Nothing drains pool events in the engine yet, so none may be recorded."""
    from hybridkv import LLM, SamplingParams

    llm = LLM(model=str(checkpoints["granitemoehybrid"]), dtype="float32", kv_cache_memory="16MiB")
    llm.generate(
        [" ".join(f"word{i}" for i in range(60))] * 3, SamplingParams(max_tokens=4), use_tqdm=False
    )
    pools = [llm.engine.kv.pool, *(sm.pool for sm in llm.engine.kv.state)]
    assert all(not p.events for p in pools)
    assert llm.engine.kv.pool.cached  # prefix caching itself still works


def test_non_finite_logits_fail_that_request_alone(
    checkpoints: dict[str, Path], tmp_path: Path
) -> None:
    """A NaN embedding row for token 999: a prompt holding it gets NaN logits (as a forged KV
    unit would give); it fails with a clear error and no token, the others are unchanged."""
    from safetensors.torch import load_file, save_file

    model_dir = copy_checkpoint(checkpoints["granitemoehybrid"], tmp_path / "m")
    path = model_dir / "model.safetensors"
    tensors = load_file(str(path))
    tensors["model.embed_tokens.weight"][999] = float("nan")
    save_file(tensors, str(path), {"format": "pt"})
    good = [random_ids(20, 50), random_ids(30, 51)]
    poisoned = [t for t in random_ids(25, 52) if t != 999] + [999, 5]
    llm = make_llm(model_dir)
    outs = llm.generate([good[0], poisoned, good[1]], greedy(logprobs=True), use_tqdm=False)
    assert outs[1].finish_reason == "error" and outs[1].token_ids == []
    assert outs[1].error is not None and "non-finite logits" in outs[1].error
    assert_matches_hf(checkpoints["granitemoehybrid"], good, [outs[0], outs[2]], "beside NaN")
    for o in (outs[0], outs[2]):
        entries = o.outputs[0].logprobs or []
        assert len(entries) == len(o.token_ids)
        assert all(e[t].logprob == e[t].logprob for t, e in zip(o.token_ids, entries, strict=True))
    assert_no_leaks(llm.engine)
