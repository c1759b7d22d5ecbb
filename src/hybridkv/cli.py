"""The ``hybridkv`` command line: make-model, generate (serve comes with the server)."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import MISSING, fields
from pathlib import Path
from typing import Any

from hybridkv import __version__
from hybridkv.config import BF16_MATMUL_CHOICES, CacheConfig, EngineConfig, SchedulerConfig
from hybridkv.engine.frontend import (
    DEFAULT_MAX_LOGPROBS,
    DTYPE_CHOICES,
    FrontendOptions,
    engine_dtype,
)
from hybridkv.model.families.registry import get_make_model_archs  # no torch
from hybridkv.vllm_options import (
    add_foreign_flags,
    check_foreign,
    foreign_values,
    kv_cache_memory_from_env,
)


def add_engine_flags(p: argparse.ArgumentParser) -> None:
    """vLLM-named engine flags, generated from the config fields (their docs are the help)."""
    g = p.add_argument_group("engine options")
    g.add_argument(
        "--dtype",
        choices=DTYPE_CHOICES,
        default="auto",
        help="weights and KV dtype; auto: the checkpoint's (bfloat16 stays bfloat16, else "
        "float32); float is float32; half/float16 are refused with an error (CPU float16 "
        "matmuls are slow: use bfloat16, same memory)",
    )
    g.add_argument(
        "--bf16-matmul",
        choices=BF16_MATMUL_CHOICES,
        default="auto",
        help="where a bfloat16 model multiplies: natively, or in float32 (fast on CPUs without "
        "native bfloat16; weights take float32 memory); auto picks by CPU (default: auto)",
    )
    g.add_argument(
        "--seed", type=int, default=0, help="engine seed (and the default sampling seed)"
    )
    g.add_argument(
        "--kv-transfer-config",
        default=None,
        help="KV connector config as JSON, e.g. "
        '\'{"kv_connector": "FileConnector", "kv_connector_extra_config": {"path": "./kv"}}\'',
    )
    g.add_argument(
        "--kv-events-config",
        default=None,
        help="publish KV cache events (vLLM's wire format) as JSON, e.g. "
        "'{\"enable_kv_cache_events\": true}' (binds tcp://127.0.0.1:5557; docs/kv_events.md "
        "says how to reach other hosts)",
    )
    for sub in (CacheConfig, SchedulerConfig):
        for f in fields(sub):
            flag = "--" + f.name.replace("_", "-")
            default = f.default if f.default is not MISSING else None
            helptext = f"{f.metadata.get('help', '')} (default: {default})"
            if f.type in ("bool", bool):
                g.add_argument(
                    flag, action=argparse.BooleanOptionalAction, default=None, help=helptext
                )
            elif f.name in ("kv_cache_memory", "prefix_caching_hash_algo"):
                g.add_argument(flag, type=str, default=None, help=helptext)
            elif f.type in ("float", float):
                g.add_argument(flag, type=float, default=None, help=helptext)
            else:
                g.add_argument(flag, type=int, default=None, help=helptext)
    add_foreign_flags(p)  # vLLM's flags with no job here: accepted, with one warning


def add_frontend_flags(p: argparse.ArgumentParser) -> None:
    """What sits on top of the engine (vLLM's flags): tokenizer, template, sampling defaults."""
    g = p.add_argument_group("tokenizer, chat template and sampling defaults")
    g.add_argument(
        "--tokenizer", default=None, help="tokenizer directory (default: the model's own)"
    )
    g.add_argument(
        "--chat-template",
        default=None,
        help="chat template: a jinja file, or the template text (default: the model's)",
    )
    g.add_argument(
        "--generation-config",
        default="auto",
        help="sampling defaults: 'auto' reads the model's generation_config.json "
        "(temperature, top_p, top_k, min_p, repetition_penalty; max_new_tokens caps "
        "max_tokens), 'vllm' ignores it, or a directory holding one (default: auto)",
    )
    g.add_argument(
        "--max-logprobs",
        type=int,
        default=DEFAULT_MAX_LOGPROBS,
        help=f"most alternatives per token for logprobs / prompt_logprobs "
        f"(default: {DEFAULT_MAX_LOGPROBS})",
    )


def frontend_options(args: argparse.Namespace) -> FrontendOptions:
    return FrontendOptions(
        tokenizer=args.tokenizer,
        chat_template=args.chat_template,
        generation_config=args.generation_config,
        max_logprobs=args.max_logprobs,
    )


def engine_options(args: argparse.Namespace) -> dict[str, Any]:
    """The engine options given, checked: ``kv_transfer_config`` comes back parsed (with its
    connector's options), so a bad option fails here, before torch or any weight loads. vLLM's
    options with no job here are refused or warned about once (``vllm_options.py``)."""
    warning = check_foreign(foreign_values(args), as_flags=True)
    if warning:
        print(f"hybridkv: warning: {warning}", file=sys.stderr)
    names = ["dtype", "bf16_matmul", "seed", "kv_transfer_config", "kv_events_config"] + [
        f.name for sub in (CacheConfig, SchedulerConfig) for f in fields(sub)
    ]
    options = {n: getattr(args, n) for n in names if getattr(args, n, None) is not None}
    options = kv_cache_memory_from_env(options)  # vLLM CPU's $VLLM_CPU_KVCACHE_SPACE
    if "dtype" in options:
        options["dtype"] = engine_dtype(options["dtype"])
    model = getattr(args, "model_tag", None) or getattr(args, "model", None)
    config = EngineConfig.create(model or "", **options)
    if config.kv_transfer_config is not None:
        options["kv_transfer_config"] = config.kv_transfer_config
    if config.kv_events_config is not None:
        options["kv_events_config"] = config.kv_events_config
    return options


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hybridkv",
        description="An LLM inference engine for hybrid models.",
        allow_abbrev=False,
    )
    parser.add_argument("--version", action="version", version=f"hybridkv {__version__}")
    subs = parser.add_subparsers(dest="command", required=True)

    mk = subs.add_parser(
        "make-model", help="write a random-weight checkpoint in Hugging Face format"
    )
    mk.add_argument("--arch", choices=get_make_model_archs(), required=True)
    mk.add_argument("--out", type=Path, required=True, help="output directory")
    mk.add_argument("--size", choices=("tiny", "small"), default="tiny")
    mk.add_argument("--seed", type=int, default=0)

    gen = subs.add_parser("generate", help="generate completions for prompts offline")
    gen.add_argument(
        "--model", default=None, help="checkpoint directory (default: the embedded tiny hybrid)"
    )
    src = gen.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", help="one prompt")
    src.add_argument(
        "--prompts-file",
        type=Path,
        help='JSONL: {"prompt": ...} or {"prompt_token_ids": [...]} per line',
    )
    gen.add_argument("--max-tokens", type=int, default=32)
    gen.add_argument("--temperature", type=float, default=0.0)
    gen.add_argument("--json", action="store_true", help="one JSON object per request on stdout")
    add_frontend_flags(gen)
    add_engine_flags(gen)

    from hybridkv.server.command import add_serve_parser

    add_serve_parser(subs, add_frontend_flags, add_engine_flags)
    from hybridkv.proxy.command import add_proxy_parser

    add_proxy_parser(subs)
    for sub in subs.choices.values():
        sub.allow_abbrev = False  # a misspelled option must not pass as a prefix of a real one
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "make-model":
            return _make_model(args)
        if args.command == "generate":
            return _generate(args)
        if args.command == "proxy":
            from hybridkv.proxy.command import run_proxy

            return run_proxy(args)
        if args.command == "serve":
            from hybridkv.server.command import run_serve

            return run_serve(args, engine_options(args), frontend_options(args))
    except (ValueError, FileNotFoundError) as exc:
        print(f"hybridkv: error: {exc}", file=sys.stderr)
        return 2
    return 1


def _make_model(args: argparse.Namespace) -> int:
    from hybridkv.model.loading.make_model import make_model

    out = make_model(args.arch, args.out, size=args.size, seed=args.seed)
    print(f"wrote a {args.size} random-weight {args.arch} checkpoint to {out}")
    return 0


def read_prompts_file(path: Path) -> list[dict[str, Any]]:
    """Each line ``{"prompt": str}`` or ``{"prompt_token_ids": [int]}``; errors name the line."""
    items = []
    for n, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}:{n}: not valid JSON ({exc.msg})") from None
        ok = isinstance(obj, dict) and (
            isinstance(obj.get("prompt"), str)
            or (
                isinstance(obj.get("prompt_token_ids"), list)
                and all(isinstance(t, int) for t in obj["prompt_token_ids"])
            )
        )
        if not ok:
            raise ValueError(
                f'{path}:{n}: expected {{"prompt": "..."}} or {{"prompt_token_ids": [ints]}}'
            )
        items.append(obj)
    if not items:
        raise ValueError(f"{path}: no prompts")
    return items


def _generate(args: argparse.Namespace) -> int:
    options = engine_options(args)  # before the imports below load torch
    from hybridkv import LLM, SamplingParams

    prompts: list[Any] = (
        [args.prompt] if args.prompt is not None else read_prompts_file(args.prompts_file)
    )
    params = SamplingParams(
        max_tokens=args.max_tokens, temperature=args.temperature, seed=args.seed
    )
    front = frontend_options(args)
    llm = LLM(args.model, tokenizer=front.tokenizer, generation_config=front.generation_config,
              max_logprobs=front.max_logprobs, **options)  # fmt: skip
    with llm:  # its end waits (bounded) for the connector's saves and joins its threads
        if front.chat_template is not None:
            llm.get_tokenizer().set_chat_template(front.chat_template)
        outputs = llm.generate(prompts, params, use_tqdm=not args.json and len(prompts) > 1)
    failed = 0
    for out in outputs:
        failed += out.finish_reason == "error"
        if out.error:  # the other prompts still run; the exit status says one failed
            print(f"hybridkv: error: {out.error}", file=sys.stderr)
        if args.json:
            record = {
                "text": out.text,
                "token_ids": out.token_ids,
                "finish_reason": out.finish_reason,
                "prompt_tokens": out.num_prompt_tokens,
                "cached_tokens": out.cached_tokens,
            }
            if out.error:
                record["error"] = out.error
            print(json.dumps(record))
        elif not out.error:
            print(f"{out.prompt!r} -> {out.text!r} ({out.finish_reason})")
    return 1 if failed else 0
