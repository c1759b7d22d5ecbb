"""vLLM's side of ``throughput_mixed.py --baseline vllm``: runs in vLLM's own virtualenv
(``benchmarks/setup_vllm_baseline.sh``), started by the parent as a subprocess.

    /work/vllm-venv/bin/python benchmarks/vllm_mixed_worker.py SPEC.json

SPEC.json: ``model``, ``dtype``, ``prompts`` (token ids), ``output_lens``, ``max_num_seqs``,
``max_model_len``, ``kv_cache_bytes`` (hybridkv's KV space), ``memory_utilization``, and
optionally ``engine_overrides``: further ``LLM`` keyword arguments that depart from vLLM's
defaults (the parent names each and says why, e.g. ``enable_prefix_caching: false`` for Mamba2
hybrids, see ``throughput_mixed.py``). vLLM runs in its default configuration otherwise (its CPU
thread binding included; ``VLLM_CPU_OMP_THREADS_BIND`` in the environment changes it). Line
protocol on stdout, one JSON object per line (vLLM's logs go to stderr):

    {"ready": true, "startup_s": ..., "vllm": "0.32.0", "threads": ..., ...}   after start-up
    stdin "run"  -> {"seconds": ..., "tokens": [[...], ...], "cached_tokens": ...}   one timed
                    generate call; cached_tokens: prompt tokens served from vLLM's prefix cache
    stdin "quit" -> exits
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from typing import Any

os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")  # stdout carries the protocol


def reply(obj: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def _kill_group_on_term() -> None:
    """The benchmark starts this worker as a session leader: on SIGTERM (the benchmark killed,
    or dying: its PR_SET_PDEATHSIG) take vLLM's engine and worker processes down too; they
    outlive their parent otherwise."""

    def kill(signum: int, frame: object) -> None:
        os.killpg(0, signal.SIGKILL)

    if os.getpgid(0) == os.getpid():
        signal.signal(signal.SIGTERM, kill)


def main() -> int:
    _kill_group_on_term()
    with open(sys.argv[1]) as f:
        spec = json.load(f)
    began = time.perf_counter()
    import torch
    import vllm
    from vllm import LLM, SamplingParams

    llm = LLM(
        model=spec["model"],
        dtype=spec["dtype"],
        max_num_seqs=spec["max_num_seqs"],
        max_model_len=spec["max_model_len"],
        seed=0,
        # NOTE: vLLM's default reserves 92 % of the machine's memory and refuses to start when
        # other processes hold more than 8 %; the KV space is set as hybridkv's instead.
        kv_cache_memory_bytes=spec["kv_cache_bytes"],
        gpu_memory_utilization=spec["memory_utilization"],
        **spec.get("engine_overrides", {}),
    )
    params = [
        SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True) for n in spec["output_lens"]
    ]
    prompts: list[Any] = [{"prompt_token_ids": p} for p in spec["prompts"]]
    reply(
        {
            "ready": True,
            "startup_s": time.perf_counter() - began,
            "vllm": vllm.__version__,
            "torch": torch.__version__,
            "threads_in_front_process": torch.get_num_threads(),
            "kv_cache_bytes": spec["kv_cache_bytes"],
            "engine_overrides": spec.get("engine_overrides", {}),
            "enable_prefix_caching": llm.llm_engine.vllm_config.cache_config.enable_prefix_caching,
            "VLLM_CPU_OMP_THREADS_BIND": os.environ.get("VLLM_CPU_OMP_THREADS_BIND", "auto"),
        }
    )
    for line in sys.stdin:
        command = line.strip()
        if command == "quit":
            break
        if command != "run":
            reply({"error": f"unknown command {command!r}"})
            continue
        began = time.perf_counter()
        outs = llm.generate(prompts, params, use_tqdm=False)
        seconds = time.perf_counter() - began
        reply(
            {
                "seconds": seconds,
                "tokens": [list(o.outputs[0].token_ids) for o in outs],
                "cached_tokens": sum(o.num_cached_tokens or 0 for o in outs),
            }
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
