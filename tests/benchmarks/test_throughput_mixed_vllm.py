"""``throughput_mixed.py --baseline vllm``: its arguments are checked, and the harness drives a
worker through the line protocol of ``vllm_mixed_worker.py`` (here a fake worker standing in
for vLLM, which CI does not install): alternating timed runs, outputs compared token by token,
and vLLM's settings changed only where a checkpoint needs it (the fake fails like vLLM 0.32's
CPU backend does on a Mamba2 hybrid with prefix caching on)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tests.benchmarks.quick import ROOT, run_quick

SCRIPT = ROOT / "benchmarks" / "throughput_mixed.py"

FAKE_WORKER = """#!{python}
import json, os, sys
spec = json.load(open(sys.argv[2]))  # argv[1] is vllm_mixed_worker.py
assert spec["max_num_seqs"] > 0 and spec["kv_cache_bytes"] > 0
config = json.load(open(os.path.join(spec["model"], "config.json")))
prefix_caching = spec["engine_overrides"].get("enable_prefix_caching", True)
print(json.dumps({{"ready": True, "startup_s": 0.0}}), flush=True)
for run, line in enumerate(sys.stdin):
    if line.strip() == "quit":
        break
    if prefix_caching and config["model_type"] == "granitemoehybrid":
        sys.exit("IndexError: index 17 is out of bounds for dimension 0 with size 16")
    tokens = [[7] * n for n in spec["output_lens"]]
    cached = 5 * run if prefix_caching else 0  # later runs reuse the earlier ones' prompts
    print(json.dumps({{"seconds": 0.25, "tokens": tokens, "cached_tokens": cached}}), flush=True)
"""


def run_args(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, cwd=ROOT, timeout=120
    )


def test_vllm_baseline_needs_its_virtualenv(tmp_path: Path) -> None:
    res = run_args("--baseline", "vllm", "--vllm-python", str(tmp_path / "no-python"))
    assert res.returncode == 2
    assert "no-python not found" in res.stderr and "setup_vllm_baseline.sh" in res.stderr


def test_omp_bind_needs_the_vllm_baseline() -> None:
    res = run_args("--vllm-omp-bind", "0-1")
    assert res.returncode == 2 and "--vllm-omp-bind needs --baseline vllm" in res.stderr
    res = run_args("--prefix-caching", "default")
    assert res.returncode == 2 and "--prefix-caching needs --baseline vllm" in res.stderr


def load_vllm_mixed(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """``benchmarks/vllm_mixed.py`` (a script's module: not on the import path)."""
    spec = importlib.util.spec_from_file_location("vllm_mixed", ROOT / "benchmarks/vllm_mixed.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)  # its dataclasses look themselves up
    spec.loader.exec_module(module)
    return module


def test_vllm_prefix_caching_off_by_default_and_always_for_mamba2(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    vm = load_vllm_mixed(monkeypatch)
    granite, gemma = {"model_type": "granitemoehybrid"}, {"model_type": "gemma3_text"}
    assert vm.vllm_overrides(gemma, prefix_caching=True) == ()
    [same_work] = vm.vllm_overrides(gemma, prefix_caching=False)
    assert "repeats the warm-up's prompts" in same_work.reason
    [mamba2] = vm.vllm_overrides(granite, prefix_caching=True)
    assert "return_intermediate_states" in mamba2.reason
    both = vm.vllm_overrides(granite, prefix_caching=False)
    assert both == (mamba2, same_work)
    assert vm.engine_kwargs(both) == {"enable_prefix_caching": False}
    clash = vm.EngineOverride("enable_prefix_caching", True, "clash")
    with pytest.raises(ValueError, match="conflicting vLLM overrides for enable_prefix_caching"):
        vm.engine_kwargs((mamba2, clash))


@pytest.mark.slow
def test_harness_drives_a_worker_and_compares_tokens(tmp_path: Path) -> None:
    fake = tmp_path / "fake-python"
    fake.write_text(FAKE_WORKER.format(python=sys.executable))
    fake.chmod(0o755)
    out = run_quick(
        "throughput_mixed.py",
        "--cache-dir",
        str(tmp_path),
        "--baseline",
        "vllm",
        "--vllm-python",
        str(fake),
        "--prefix-caching",
        "default",
        timeout=300,
    )
    # --baseline vllm's default --archs: the ones vLLM's CPU backend runs; vLLM's prefix caching
    # kept on (its default) except for Granite's Mamba2 layers
    assert set(out["results"]) == {
        f"{arch}-tiny-float32" for arch in ("qwen3_full", "gemma3", "granitemoehybrid")
    }
    for name, case in out["results"].items():
        assert "error" not in case, (name, case)
        assert case["token_identical"] is False  # the fake answers 7s, hybridkv does not
        assert case["first_divergence"]["request"] in range(8)
        assert case["vllm_info"]["ready"] is True
        assert case["vllm"]["tokens_per_s"]["median"] > 0
        assert case["ratio"]["median"] > 0
        assert case["hybridkv_prefix_caching"] is True  # each engine's default
    granite = out["results"]["granitemoehybrid-tiny-float32"]
    [change] = granite["vllm_config_changes"]
    assert change["setting"] == "enable_prefix_caching" and change["value"] is False
    assert "return_intermediate_states" in change["reason"]
    assert granite["vllm_cached_tokens"] == [0, 0]  # warm-up, one timed run
    gemma = out["results"]["gemma3-tiny-float32"]
    assert gemma["vllm_config_changes"] == [] and gemma["vllm_cached_tokens"] == [0, 5]
    assert "cpu_flags" in out["machine"]
