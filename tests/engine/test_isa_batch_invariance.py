"""Engine-level batch invariance on every instruction-set variant this CPU runs: a prompt's
greedy tokens are the same alone and inside a batch of 32 mixed prompts, on an attention model
and a Mamba2 hybrid, each variant in its own process (``HYBRIDKV_NATIVE_ISA``). The checkpoints
are wide enough (hidden 256) that the projections take the skinny GEMM at decode. (Logprob
bits may differ: large prefill steps go through MKL, whose sums depend on the batch.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hybridkv.native.isa import ISA_ENV, VARIANTS, missing_flags
from tests.support.checkpoints import make_hf_checkpoint

ROOT = Path(__file__).resolve().parents[2]
WIDE = {
    "qwen3": {"hidden_size": 256, "intermediate_size": 1024, "head_dim": 64},
    "granitemoehybrid": {
        "hidden_size": 256, "shared_intermediate_size": 1024, "mamba_d_head": 128,
        "attention_multiplier": 1 / 64,
    },
}  # fmt: skip


@pytest.fixture(scope="module")
def wide_checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("wide")
    return {arch: make_hf_checkpoint(arch, root / arch, **cfg) for arch, cfg in WIDE.items()}


@pytest.mark.slow
@pytest.mark.parametrize("arch", list(WIDE))
@pytest.mark.parametrize("isa", list(VARIANTS))
def test_greedy_tokens_do_not_depend_on_the_batch(
    wide_checkpoints: dict[str, Path], arch: str, isa: str
) -> None:
    missing = missing_flags(VARIANTS[isa])
    if missing:
        pytest.skip(f"this CPU cannot run the {isa} build (it lacks {', '.join(missing)})")
    env = {**os.environ, ISA_ENV: isa, "HYBRIDKV_NATIVE": "1"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    child = [sys.executable, "-m", "tests.engine.isa_child", str(wide_checkpoints[arch])]
    done = subprocess.run(child, env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert len(result["alone"]) == 4
    for i, tokens in result["alone"].items():
        assert len(tokens) == 24
        assert tokens == result["batched"][i], f"prompt {i} alone differs from its batched run"
