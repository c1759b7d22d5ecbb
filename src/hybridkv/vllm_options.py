"""vLLM's options that have no job on a CPU engine: one table, read by the ``hybridkv`` command
line (each entry becomes a flag of ``generate`` and ``serve``) and by ``LLM(**kwargs)``, so a
vLLM launch script or notebook runs unchanged.

A vLLM option meets one of four fates (docs/vllm-migration.md lists them all):

- **mapped**: hybridkv has it under vLLM's name (``--max-model-len``, ``--block-size``...) and
  it does what it does in vLLM; not in this table;
- **renamed**: vLLM's name for one of ours (``RENAMED``);
- **ignored**: accepted; one warning names every ignored option given and why it does nothing
  here (``ForeignOption.why``);
- **refused**: a value that would change what runs (``--tensor-parallel-size 2``,
  ``--kv-cache-dtype fp8``): an error naming the option, the value and why
  (``ForeignOption.refusal``); the harmless values (``1``, ``auto``) are only ignored.

Any option in none of these is still an error (argparse's, or ``EngineConfig.create``'s).
"""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any


class Takes(Enum):
    VALUE = "value"  # --name VALUE
    SWITCH = "switch"  # --name / --no-name


@dataclass(frozen=True, slots=True)
class ForeignOption:
    name: str  # vLLM's (EngineArgs / LLM keyword; the flag is --name-with-dashes)
    why: str  # why it does nothing here
    takes: Takes = Takes.VALUE
    harmless: tuple[str, ...] | None = None  # values that do nothing (None: any); others refused
    refusal: str = ""  # why the other values are refused

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")


_ONE_PROCESS = "hybridkv runs one model copy in one process (scale out with several servers "
_ONE_PROCESS += "behind `hybridkv proxy` or any HTTP router)"
_NO_CUDA_GRAPHS = "CUDA graph capture; the CPU engine has no graphs to capture"
_NO_IMAGES = "image inputs are not supported (the text model of multimodal checkpoints runs)"


def _switch(name: str, why: str, refused_when_on: str = "") -> ForeignOption:
    if refused_when_on:
        return ForeignOption(name, why, Takes.SWITCH, ("False",), refused_when_on)
    return ForeignOption(name, why, Takes.SWITCH)


def _sized(name: str, what: str) -> ForeignOption:
    why = "1 is the only size: one model copy runs in one process"
    return ForeignOption(name, why, Takes.VALUE, ("1",), f"{what} is not supported: {_ONE_PROCESS}")


_GENERATE = "only text generation is supported (no pooling, embedding or scoring)"
_O = ForeignOption  # an option whose every value does nothing here


def _only(name: str, harmless: tuple[str, ...], why: str, refusal: str) -> ForeignOption:
    """An option whose ``harmless`` values do nothing here and whose others are refused."""
    return ForeignOption(name, why, Takes.VALUE, harmless, refusal)


FOREIGN_OPTIONS: tuple[ForeignOption, ...] = (
    # GPU memory and kernels
    _O("gpu_memory_utilization", "the KV cache is sized in bytes by --kv-cache-memory"),
    _switch("enforce_eager", "the CPU engine always runs eagerly, without CUDA graphs"),
    _O("max_seq_len_to_capture", _NO_CUDA_GRAPHS),
    _O("cuda_graph_sizes", _NO_CUDA_GRAPHS),
    _O("compilation_config", "torch.compile and CUDA graph settings; the CPU kernels are ours"),
    _O("swap_space", "swaps GPU blocks to CPU memory; preempted requests are recomputed here"),
    _O("cpu_offload_gb", "moves weights from the GPU to CPU memory, where they are"),
    _switch("enable_sleep_mode", "frees GPU memory while idle; there is no GPU memory"),
    _switch("calculate_kv_scales", "scales for an fp8 KV cache; the KV cache is never fp8"),
    _only("device", ("auto", "cpu"), "hybridkv runs on the CPU", "hybridkv runs on the CPU only"),
    _only(
        "kv_cache_dtype",
        ("auto",),
        "the KV cache takes the model's dtype (--dtype)",
        "a KV cache dtype other than the model's (fp8...) is not supported",
    ),  # fmt: skip
    # parallelism and process layout
    _sized("tensor_parallel_size", "tensor parallelism"),
    _sized("pipeline_parallel_size", "pipeline parallelism"),
    _sized("data_parallel_size", "data parallelism in one server"),
    _switch("enable_expert_parallel", "experts run together in the one process"),
    _O("distributed_executor_backend", _ONE_PROCESS),
    _switch("disable_custom_all_reduce", "an all-reduce between GPUs; one process here"),
    _switch("disable_frontend_multiprocessing", "the server and the engine share one process"),
    _O("max_parallel_loading_workers", "weights load once, from safetensors"),
    # scheduling
    _switch("enable_chunked_prefill", "prefill is always chunked by --max-num-batched-tokens"),
    _O("long_prefill_token_threshold", "prefill chunks follow --max-num-batched-tokens"),
    _switch("async_scheduling", "steps run one after another (no overlap to enable)"),
    _switch("disable_async_output_proc", "outputs are processed in the step that makes them"),
    _only(
        "scheduling_policy",
        ("fcfs",),
        "requests are served first come, first served",
        "only first-come-first-served scheduling (fcfs) exists",
    ),  # fmt: skip
    # the model and its files
    _switch("trust_remote_code", "only built-in architectures run: no checkpoint code runs"),
    _only(
        "load_format",
        ("auto", "safetensors"),
        "checkpoints load from safetensors",
        "only safetensors checkpoints load",
    ),  # fmt: skip
    _only(
        "tokenizer_mode",
        ("auto", "hf", "slow"),
        "tokenizer.json is read with tokenizers",
        "only Hugging Face tokenizers load",
    ),  # fmt: skip
    _only("task", ("auto", "generate"), "hybridkv generates text", _GENERATE),
    _only("runner", ("auto", "generate"), "hybridkv generates text", _GENERATE),
    _only("quantization", (), "", "quantized checkpoints are not supported: use bf16 or fp32"),
    _only("speculative_config", (), "", "speculative decoding is not supported"),
    _switch("enable_lora", "LoRA stays off, as asked", "LoRA adapters are not supported"),
    _O("limit_mm_per_prompt", _NO_IMAGES),
    _O("mm_processor_kwargs", _NO_IMAGES),
    _O("allowed_local_media_path", _NO_IMAGES),
    _O("guided_decoding_backend", "structured outputs always use llguidance"),
    # logging and the HTTP front end
    _switch("disable_log_stats", "the stats line is logged every 10 s (--log-level warning)"),
    _switch("enable_log_requests", "requests are logged by default (--disable-log-requests)"),
    _O("max_log_len", "request log lines show lengths and parameters, not prompts"),
    _switch("disable_uvicorn_access_log", "set --uvicorn-log-level warning to hide access lines"),
    _switch("enable_prompt_tokens_details", "prompt_tokens_details are always in the usage"),
)
FOREIGN_BY_NAME = {o.name: o for o in FOREIGN_OPTIONS}
# vLLM's name -> ours (the same option, another name)
RENAMED = {"kv_cache_memory_bytes": "kv_cache_memory"}
# vLLM CPU's KV cache size in GiB; read when kv_cache_memory is not given
KVCACHE_SPACE_ENV = "VLLM_CPU_KVCACHE_SPACE"


def kv_cache_memory_from_env(options: Mapping[str, Any]) -> dict[str, Any]:
    """``options`` with ``kv_cache_memory`` from ``$VLLM_CPU_KVCACHE_SPACE`` (GiB, vLLM CPU's
    way to size the KV cache) when it is set and the options do not size the cache; a value
    that is not a positive number of GiB is a ``ValueError`` naming the variable."""
    raw = os.environ.get(KVCACHE_SPACE_ENV, "").strip()
    if not raw or options.get("kv_cache_memory") is not None:
        return dict(options)
    try:
        gib = float(raw)
    except ValueError:
        gib = math.nan
    if not (math.isfinite(gib) and 0 < gib <= 1 << 20):
        raise ValueError(f"${KVCACHE_SPACE_ENV}={raw!r}: must be a positive number of GiB")
    return {**options, "kv_cache_memory": int(gib * (1 << 30))}


def add_foreign_flags(parser: argparse.ArgumentParser) -> None:
    """vLLM's flags of ``FOREIGN_OPTIONS`` and ``RENAMED`` (each help says what becomes of
    it)."""
    g = parser.add_argument_group("vLLM options with no job here (accepted, with a warning)")
    for o in FOREIGN_OPTIONS:
        if o.harmless is None:
            fate = f"ignored: {o.why}"
        elif o.why:
            fate = f"{'/'.join(o.harmless)} ignored ({o.why}); others refused: {o.refusal}"
        else:
            fate = f"refused: {o.refusal}"
        if o.takes is Takes.SWITCH:
            g.add_argument(o.flag, action=argparse.BooleanOptionalAction, default=None, help=fate)
        else:
            g.add_argument(o.flag, default=None, metavar="VALUE", help=fate)
    for vllm_name, ours in RENAMED.items():
        g.add_argument("--" + vllm_name.replace("_", "-"), dest=ours, default=None,
                       help=f"vLLM's name of --{ours.replace('_', '-')}")  # fmt: skip


def foreign_values(args: argparse.Namespace) -> dict[str, Any]:
    """The ``FOREIGN_OPTIONS`` given on a command line."""
    return {o.name: getattr(args, o.name) for o in FOREIGN_OPTIONS
            if getattr(args, o.name, None) is not None}  # fmt: skip


def split_vllm_options(options: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """``LLM(**kwargs)``: (ours, with vLLM's renamed names mapped; the foreign ones given)."""
    ours: dict[str, Any] = {}
    foreign: dict[str, Any] = {}
    for name, value in options.items():
        if name in FOREIGN_BY_NAME:
            if value is not None:
                foreign[name] = value
        elif name in RENAMED:
            if RENAMED[name] in options:
                raise ValueError(f"give {name} or {RENAMED[name]}, not both")
            ours[RENAMED[name]] = value
        else:
            ours[name] = value
    return ours, foreign


def check_foreign(given: Mapping[str, Any], as_flags: bool) -> str | None:
    """A ``ValueError`` for the first refused value; else the one warning naming every ignored
    option given and why (``None`` if none was given). ``as_flags``: name them ``--x-y``."""
    ignored = []
    for name, value in given.items():
        o = FOREIGN_BY_NAME[name]
        shown = o.flag if as_flags else name
        text = str(value)
        if o.harmless is not None and text not in o.harmless:
            raise ValueError(f"{shown}={text}: {o.refusal}")
        ignored.append(f"{shown}{'' if value is True and as_flags else '=' + text}: {o.why}")
    if not ignored:
        return None
    return "ignoring vLLM options that do nothing here (" + "; ".join(ignored) + ")"
