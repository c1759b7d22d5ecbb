"""B3 baseline: the chat trace of ``prefix_trace_workload.py`` through vLLM 0.32's own
``Scheduler`` and ``KVCacheManager`` (no model), counting the prompt tokens vLLM would reuse.

Run with vLLM's virtualenv (``prefix_trace.py --vllm`` starts it as a subprocess)::

    /work/vllm-venv/bin/python benchmarks/prefix_trace_vllm.py --jobs J.json \
        --hf-config granite.json --layer-kinds mamba2,attention --memory 2147483648

``--jobs`` is a JSON list of ``{"trace": [Turn.to_json(), ...], "prefix_match_unit": int | null}``:
one process (one vLLM import, the slow part) runs every trace of a layout, each through a
fresh scheduler.

vLLM is configured the way its engine configures itself, without a GPU and without weights
(``vllm_setup.py``, shared with ``vllm_kv_baseline.py``): ``EngineArgs(model=<dir with the
HF config.json>, load_format="dummy", enable_prefix_caching=True, block_size=16, ...)``; vLLM's
``MambaModelConfig`` then turns ``mamba_cache_mode`` from "none" into **"align"** (its default
with prefix caching), and ``Platform.update_block_size_for_backend`` enlarges the attention
block until one attention page holds one Mamba/GDN state (this is vLLM's rule for hybrid
models, and ``mamba_block_size`` follows it in align mode). Per-layer specs are the ones vLLM's
layers report (Mamba2: ``num_prefill_checkpoint_blocks=1``, so the prompt's last hash-aligned
state is saved inside the final chunk; GDN: none), the pool is ``--memory`` bytes through
``get_kv_cache_configs``, and the ``Scheduler`` is built as ``EngineCore`` builds it
(synchronous scheduling, ``max_num_batched_tokens`` as given, no connector, no speculation).

Each turn is one ``Request`` (``SamplingParams(max_tokens=len(reply), ignore_eos=True)``),
added when the previous one finished; a fake runner output samples the trace's reply tokens
one by one. The hit is the request's ``num_computed_tokens`` when it is first scheduled.
Prints one JSON object on stdout: vLLM's version and, per job, its config and hits.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")  # keep stdout pure JSON

import vllm_setup  # noqa: E402

MAX_MODEL_LEN = 4096


def build_config(model_dir: Path, dtype: str, batched_tokens: int, **extra: Any) -> Any:
    """vLLM's config for the HF config in ``model_dir``, block sizes as its executor sets them."""
    from vllm.engine.arg_utils import EngineArgs

    args = EngineArgs(
        model=str(model_dir),
        skip_tokenizer_init=True,
        load_format="dummy",
        dtype=dtype,
        max_model_len=MAX_MODEL_LEN,
        block_size=16,
        enable_prefix_caching=True,
        prefix_caching_hash_algo="sha256",
        max_num_batched_tokens=batched_tokens,
        max_num_seqs=16,
        async_scheduling=False,
        **extra,
    )
    vc = args.create_engine_config()
    vllm_setup.force_block_sizes(vc, attention_backends(vc))
    return vc


def attention_backends(vc: Any) -> list[Any]:
    from vllm.config.vllm import set_current_vllm_config
    from vllm.v1.attention.selector import get_attn_backend

    mc = vc.model_config
    with set_current_vllm_config(vc):
        return [
            get_attn_backend(
                mc.get_head_size(),
                mc.dtype,
                vc.cache_config.cache_dtype,
                num_heads=mc.get_num_attention_heads(vc.parallel_config),
            )
        ]


def layer_specs(vc: Any, layer_kinds: list[str]) -> dict[str, Any]:
    """What vLLM's Attention and Mamba2 / GDN layers report from ``get_kv_cache_spec``."""
    from vllm.model_executor.models import ModelRegistry
    from vllm.v1.attention.backends.registry import MambaAttentionBackendEnum
    from vllm.v1.kv_cache_interface import FullAttentionSpec, MambaSpec

    mc, cc = vc.model_config, vc.cache_config
    model_cls, _ = ModelRegistry.resolve_model_cls(mc.architecture, model_config=mc)
    shapes = tuple(tuple(x) for x in model_cls.get_mamba_state_shape_from_config(vc))
    dtypes = tuple(model_cls.get_mamba_state_dtype_from_config(vc))
    specs: dict[str, Any] = {}
    for i, kind in enumerate(layer_kinds):
        name = f"model.layers.{i}.mixer"
        if kind == "attention":
            specs[name] = FullAttentionSpec(
                block_size=cc.block_size,
                num_kv_heads=mc.get_num_kv_heads(vc.parallel_config),
                head_size=mc.get_head_size(),
                dtype=mc.dtype,
            )
            continue
        mamba2 = kind == "mamba2"
        specs[name] = MambaSpec(
            shapes=shapes,
            dtypes=dtypes,
            block_size=cc.mamba_block_size,
            page_size_padded=cc.mamba_page_size_padded,
            mamba_type=(
                MambaAttentionBackendEnum.MAMBA2 if mamba2 else MambaAttentionBackendEnum.GDN_ATTN
            ),
            mamba_cache_mode=cc.mamba_cache_mode,
            # MambaMixer2.get_kv_cache_spec: the scan exports the checkpoint state
            num_prefill_checkpoint_blocks=1 if mamba2 else 0,
            prefill_checkpoint_alignment=1 if mamba2 else None,
        )
    return specs


def build_scheduler(vc: Any, layer_kinds: list[str], memory: int) -> tuple[Any, Any, dict]:
    specs = layer_specs(vc, layer_kinds)
    kv_cfg, sched_bs, hash_bs, _ = vllm_setup.plan_kv_cache(
        vc, specs, memory, lambda: attention_backends(vc)
    )
    sched, hasher = vllm_setup.create_scheduler(vc, kv_cfg, sched_bs, hash_bs)
    cc = vc.cache_config
    info = {
        "mamba_cache_mode": cc.mamba_cache_mode,
        "block_size_requested": 16,
        "block_size_used": cc.block_size,
        "mamba_block_size": cc.mamba_block_size,
        "mamba_page_size_padded": cc.mamba_page_size_padded,
        "scheduler_block_size": sched_bs,
        "hash_block_size": hash_bs,
        "cache_hit_alignment_tokens": kv_cfg.cache_hit_alignment_tokens,
        "num_blocks": kv_cfg.num_blocks,
        "memory_bytes": memory,
        "max_num_batched_tokens": vc.scheduler_config.max_num_batched_tokens,
        "dtype": str(vc.model_config.dtype).replace("torch.", ""),
        "groups": vllm_setup.group_info(kv_cfg),
    }
    return sched, hasher, info


def run_trace(sched: Any, hasher: Any, turns: list[dict]) -> list[int]:
    """Every turn through the scheduler, one at a time; returns each turn's prefix hit."""
    from vllm import SamplingParams
    from vllm.v1.outputs import ModelRunnerOutput
    from vllm.v1.request import Request

    hits = []
    for i, turn in enumerate(turns):
        reply = turn["reply"]
        sp = SamplingParams(max_tokens=len(reply), ignore_eos=True)
        req = Request(f"t{i}", list(turn["prompt"]), sp, None, block_hasher=hasher)
        sched.add_request(req)
        hit = None
        for _ in range(10_000):
            if not sched.has_requests():
                break
            out = sched.schedule()
            for new in out.scheduled_new_reqs:
                hit = new.num_computed_tokens if hit is None else hit
            ids = list(out.num_scheduled_tokens)
            done = req.num_computed_tokens >= req.num_tokens
            sampled = [[reply[req.num_output_tokens]] if done else [] for _ in ids]
            mro = ModelRunnerOutput(
                req_ids=ids,
                req_id_to_index={r: k for k, r in enumerate(ids)},
                sampled_token_ids=sampled,
            )
            sched.update_from_output(out, mro)
        assert hit is not None and not sched.has_requests(), f"turn {i} did not finish"
        hits.append(hit)
    return hits


def run_job(a: argparse.Namespace, turns: list[dict], prefix_match_unit: int | None) -> dict:
    """One trace through a fresh scheduler configured as vLLM configures itself."""
    if max(len(t["prompt"]) + len(t["reply"]) for t in turns) > MAX_MODEL_LEN:
        raise SystemExit(f"a conversation is longer than max_model_len={MAX_MODEL_LEN}")
    with tempfile.TemporaryDirectory(prefix="prefix-trace-vllm-") as workdir:
        (Path(workdir) / "config.json").write_text(a.hf_config.read_text())
        vc = build_config(
            Path(workdir),
            a.dtype,
            a.max_num_batched_tokens,
            mamba_ssm_cache_dtype=a.mamba_ssm_cache_dtype,
            prefix_match_unit=prefix_match_unit,
        )
        sched, hasher, info = build_scheduler(vc, a.layer_kinds.split(","), a.memory)
        return {"config": info, "hits": run_trace(sched, hasher, turns)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--jobs", type=Path, required=True, help="JSON list of {trace, prefix_match_unit}"
    )
    p.add_argument("--hf-config", type=Path, required=True, help="the model's config.json")
    p.add_argument("--layer-kinds", required=True, help="comma list: attention, mamba2, gdn")
    p.add_argument("--memory", type=int, required=True, help="KV cache bytes")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--max-num-batched-tokens", type=int, default=2048)
    p.add_argument("--mamba-ssm-cache-dtype", default="auto")
    a = p.parse_args(argv)
    import vllm

    # prefix_match_unit: vLLM's hash block size; null = its own (the GCD of the group block sizes)
    jobs = json.loads(a.jobs.read_text())
    runs = [run_job(a, job["trace"], job["prefix_match_unit"]) for job in jobs]
    print(json.dumps({"vllm": vllm.__version__, "runs": runs}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
