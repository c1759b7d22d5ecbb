"""vLLM's launch flags on ``hybridkv serve`` / ``generate`` and vLLM's ``LLM(**kwargs)``: the
ones that apply map to ours, the ones with no job here are accepted with one warning naming
them and why, values that would change what runs are refused, unknown ones still error
(``hybridkv/vllm_options.py``). Parsing only: no model, no process."""

from __future__ import annotations

import re

import pytest

from hybridkv.cli import build_parser, engine_options
from hybridkv.server.command import model_of
from hybridkv.vllm_options import (
    FOREIGN_OPTIONS,
    RENAMED,
    ForeignOption,
    Takes,
    check_foreign,
    split_vllm_options,
)

# a CPU user's `vllm serve` line, from vLLM's docs and examples
VLLM_SERVE = (
    "serve Qwen/Qwen3-0.6B --host 0.0.0.0 --port 8001 --served-model-name qwen "
    "--max-model-len 2048 --max-num-seqs 8 --max-num-batched-tokens 512 --block-size 16 "
    "--no-enable-prefix-caching --seed 7 --dtype bfloat16 --api-key secret "
    "--disable-log-requests --generation-config vllm --kv-cache-memory-bytes 1073741824 "
    "--gpu-memory-utilization 0.9 --enforce-eager --tensor-parallel-size 1 --trust-remote-code "
    "--swap-space 4 --kv-cache-dtype auto --disable-custom-all-reduce --enable-chunked-prefill "
    "--distributed-executor-backend mp --disable-log-stats"
)


def test_a_vllm_launch_line_maps_and_warns_once(capsys: pytest.CaptureFixture[str]) -> None:
    args = build_parser().parse_args(VLLM_SERVE.split())
    options = engine_options(args)
    assert options == {
        "dtype": "bfloat16", "bf16_matmul": "auto", "seed": 7, "block_size": 16,
        "kv_cache_memory": "1073741824", "enable_prefix_caching": False, "max_num_seqs": 8,
        "max_num_batched_tokens": 512, "max_model_len": 2048,
    }  # fmt: skip
    assert (model_of(args), args.host, args.port, args.served_model_name, args.api_key) == (
        "Qwen/Qwen3-0.6B", "0.0.0.0", 8001, "qwen", "secret",
    )  # fmt: skip
    assert args.disable_log_requests and args.generation_config == "vllm"
    warnings = [line for line in capsys.readouterr().err.splitlines() if "warning" in line]
    assert len(warnings) == 1  # one warning, naming every ignored option and why
    for flag in ("--gpu-memory-utilization=0.9: the KV cache is sized in bytes",
                 "--enforce-eager: ", "--tensor-parallel-size=1: ", "--trust-remote-code: ",
                 "--swap-space=4: ", "--kv-cache-dtype=auto: ", "--disable-custom-all-reduce: ",
                 "--enable-chunked-prefill: ", "--distributed-executor-backend=mp: ",
                 "--disable-log-stats: "):  # fmt: skip
        assert flag in warnings[0]


def test_no_warning_without_foreign_flags(capsys: pytest.CaptureFixture[str]) -> None:
    engine_options(build_parser().parse_args(["serve", "m", "--max-num-seqs", "4"]))
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (
            "--tensor-parallel-size 2",
            "--tensor-parallel-size=2: tensor parallelism is not supported",
        ),
        ("--pipeline-parallel-size 4", "--pipeline-parallel-size=4: pipeline parallelism"),
        ("--kv-cache-dtype fp8", "--kv-cache-dtype=fp8: a KV cache dtype other than the model's"),
        ("--quantization awq", "--quantization=awq: quantized checkpoints are not supported"),
        ("--enable-lora", "--enable-lora=True: LoRA adapters are not supported"),
        ("--device cuda", "--device=cuda: hybridkv runs on the CPU only"),
        ("--speculative-config {}", "--speculative-config={}: speculative decoding"),
        ("--scheduling-policy priority", "--scheduling-policy=priority: only first-come"),
        ("--task embed", "--task=embed: only text generation is supported"),
    ],
)
def test_values_that_would_change_what_runs_are_refused(flags: str, message: str) -> None:
    args = build_parser().parse_args(["serve", "m", *flags.split()])
    with pytest.raises(ValueError, match="^" + re.escape(message)):
        engine_options(args)


def test_unknown_flags_still_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "m", "--gpu-memory-utilisation", "0.9"])
    assert "unrecognized arguments: --gpu-memory-utilisation" in capsys.readouterr().err


def _given(command: list[str], o: ForeignOption, argv: list[str]) -> dict[str, object]:
    args = build_parser().parse_args([*command, *argv])
    return {o.name: getattr(args, o.name)}


def test_every_table_entry_is_a_flag_of_serve_and_generate() -> None:
    """Each option of the table parses on both subcommands: a harmless value lands in the one
    warning with its reason; any other value is refused, naming the flag."""
    for command in (["serve", "m"], ["generate", "--prompt", "hi"]):
        for o in FOREIGN_OPTIONS:
            switch = o.takes is Takes.SWITCH
            harmless = (
                (["--no-" + o.flag[2:]] if switch else [o.flag, o.harmless[0]])
                if o.harmless
                else None
            )
            if o.harmless is None:
                harmless = [o.flag] if switch else [o.flag, "x"]
            if harmless is not None:
                warning = check_foreign(_given(command, o, harmless), as_flags=True)
                assert warning and o.flag in warning and o.why in warning, o.name
            if o.harmless is not None:
                refused = [o.flag] if switch else [o.flag, "9999"]
                with pytest.raises(ValueError, match=f"^{o.flag}=.*: {re.escape(o.refusal)}"):
                    check_foreign(_given(command, o, refused), as_flags=True)


def test_llm_keywords_split_the_same_way() -> None:
    ours, foreign = split_vllm_options(
        {"max_model_len": 512, "gpu_memory_utilization": 0.9, "enforce_eager": True,
         "tensor_parallel_size": 1, "kv_cache_memory_bytes": 1 << 20, "swap_space": None}
    )  # fmt: skip
    assert ours == {"max_model_len": 512, "kv_cache_memory": 1 << 20}
    assert foreign == {"gpu_memory_utilization": 0.9, "enforce_eager": True,
                       "tensor_parallel_size": 1}  # fmt: skip
    warning = check_foreign(foreign, as_flags=False)
    assert warning is not None and "gpu_memory_utilization=0.9" in warning
    with pytest.raises(ValueError, match="tensor_parallel_size=2"):
        check_foreign({"tensor_parallel_size": 2}, as_flags=False)
    with pytest.raises(ValueError, match="not both"):
        split_vllm_options({"kv_cache_memory_bytes": 1, "kv_cache_memory": "1GiB"})
    assert set(RENAMED) == {"kv_cache_memory_bytes"}


def test_llm_refuses_before_loading_anything() -> None:
    """A refused vLLM option or an unknown one fails at once, naming it (no model is read:
    the directory does not even exist)."""
    from hybridkv import LLM

    with pytest.raises(ValueError, match="tensor_parallel_size=2: tensor parallelism"):
        LLM("/nonexistent/model", tensor_parallel_size=2)
    with pytest.raises(ValueError, match="unknown engine option 'gpu_memory_utilisation'"):
        LLM("/nonexistent/model", gpu_memory_utilisation=0.9)


def test_the_migration_page_names_every_option() -> None:
    """docs/vllm-migration.md says what becomes of each option of the table."""
    from pathlib import Path

    page = (Path(__file__).parents[2] / "docs" / "vllm-migration.md").read_text()
    missing = [o.flag for o in FOREIGN_OPTIONS if f"`{o.flag}" not in page]
    missing += [
        f"--{n.replace('_', '-')}" for n in RENAMED if f"`--{n.replace('_', '-')}" not in page
    ]
    assert missing == []


def test_vllm_cpu_kvcache_space_sizes_the_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    """vLLM CPU's ``VLLM_CPU_KVCACHE_SPACE`` (GiB) sizes the KV cache unless a flag does."""
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "2")
    options = engine_options(build_parser().parse_args(["serve", "m"]))
    assert options["kv_cache_memory"] == 2 << 30
    given = build_parser().parse_args(["serve", "m", "--kv-cache-memory", "64MiB"])
    assert engine_options(given)["kv_cache_memory"] == "64MiB"
    for bad in ("-1", "nan", "lots", "inf", "0"):
        monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", bad)
        with pytest.raises(ValueError, match=r"^\$VLLM_CPU_KVCACHE_SPACE="):
            engine_options(build_parser().parse_args(["serve", "m"]))
