"""A request body's sampling fields -> ``SamplingParams`` (vLLM's names on both sides).

A field the request sets wins; else the model's default (``generation_config.json``); else
SamplingParams's own. OpenAI's ``response_format`` and vLLM's ``structured_outputs`` extra
become ``SamplingParams.structured_outputs``. ``SamplingParams`` checks every value, so its
``ValueError`` becomes a 400 naming the parameter.
"""

from __future__ import annotations

import dataclasses
import re
from typing import TYPE_CHECKING, Any

from hybridkv.sampling.params import SamplingParams, StructuredOutputsParams
from hybridkv.server.errors import bad_request
from hybridkv.server.protocol import _SamplingFields

if TYPE_CHECKING:
    from hybridkv.server.limits import PromptLimits

# body field -> SamplingParams field, passed as given when the request sets it
PASS_THROUGH = (
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "seed",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "min_tokens",
    "allowed_token_ids",
    "bad_words",
    "include_stop_str_in_output",
    "skip_special_tokens",
    "spaces_between_special_tokens",
    "prompt_logprobs",
)
STRUCTURED_KINDS = ("json", "regex", "choice", "grammar", "json_object")


def build_sampling_params(
    body: _SamplingFields,
    defaults: dict[str, Any],
    max_tokens: int,
    *,
    logprobs: int | None,
    n: int,
    limits: PromptLimits,
    echo: bool = False,
) -> SamplingParams:
    kwargs: dict[str, Any] = {k: v for k, v in defaults.items() if k != "max_tokens"}
    kwargs.update({k: getattr(body, k) for k in PASS_THROUGH if getattr(body, k) is not None})
    kwargs["max_tokens"] = max_tokens
    kwargs["stop"] = tuple(body.stop or ())
    kwargs["stop_token_ids"] = tuple(body.stop_token_ids or ())
    kwargs["ignore_eos"] = body.ignore_eos
    if n != 1:
        kwargs["n"] = n
    if logprobs is not None:
        _check_logprobs("logprobs", logprobs, limits.max_logprobs)
        kwargs["logprobs"] = logprobs
    if echo and logprobs is not None:  # echo shows the prompt's logprobs too (vLLM's)
        kwargs["prompt_logprobs"] = max(logprobs, body.prompt_logprobs or 0)
    if kwargs.get("prompt_logprobs") is not None:
        _check_logprobs("prompt_logprobs", kwargs["prompt_logprobs"], limits.max_logprobs)
    if body.logit_bias:
        kwargs["logit_bias"] = _logit_bias(body.logit_bias)
    structured = structured_outputs(body)
    if structured is not None:
        kwargs["structured_outputs"] = structured
    extra = {
        "kv_transfer_params": body.kv_transfer_params,
        "cache_boundaries": body.cache_boundaries,
    }
    if any(v is not None for v in extra.values()):
        kwargs["extra_args"] = {k: v for k, v in extra.items() if v is not None}
    return make_sampling_params(kwargs)


def make_sampling_params(kwargs: dict[str, Any]) -> SamplingParams:
    known = {f.name for f in dataclasses.fields(SamplingParams)}
    for name in kwargs:
        refuse(name not in known, name, f"{name} is not supported by this server")
    try:
        params = SamplingParams(**kwargs)
    except (ValueError, TypeError) as exc:
        raise bad_request(str(exc), _param_of(str(exc))) from None
    check_min_tokens(params)
    return params


def check_min_tokens(params: SamplingParams) -> None:
    """A constraint may end the output before ``min_tokens`` (a ``choice`` of one-token
    words): the engine would find no token it may sample. Refused here, naming both."""
    refuse(
        params.min_tokens > 0 and params.structured_outputs is not None,
        "min_tokens",
        "min_tokens cannot be combined with a structured output (structured_outputs, "
        "response_format, or tool_choice required / named): the constraint may end the "
        "output before min_tokens tokens",
    )


def structured_outputs(body: _SamplingFields) -> Any:
    """``structured_outputs`` (vLLM's extra: one of json / regex / choice / grammar /
    json_object), or what ``response_format`` asks for; None for plain text."""
    spec: dict[str, Any] | None = None
    fmt = body.response_format
    if fmt is not None and fmt.type == "json_object":
        spec = {"json_object": True}
    elif fmt is not None and fmt.type == "json_schema":
        schema = fmt.json_schema.schema_ if fmt.json_schema is not None else None
        refuse(schema is None, "response_format", "json_schema needs json_schema.schema")
        spec = {"json": schema}
    if body.structured_outputs is not None:
        refuse(spec is not None, "structured_outputs", "give response_format or "
               "structured_outputs, not both")  # fmt: skip
        spec = {k: v for k, v in body.structured_outputs.items() if v is not None}
        kinds = sorted(set(spec) & set(STRUCTURED_KINDS))
        refuse(
            len(kinds) != 1,
            "structured_outputs",
            f"structured_outputs needs exactly one of {', '.join(STRUCTURED_KINDS)}",
        )
    if spec is None:
        return None
    try:
        return StructuredOutputsParams(**spec)
    except (ValueError, TypeError) as exc:
        raise bad_request(str(exc), "structured_outputs") from None


def _check_logprobs(name: str, k: int, limit: int) -> None:
    refuse(k < 0, name, f"{name} must be >= 0")
    refuse(k > limit, name, f"{name}={k} is more than --max-logprobs={limit}")


def _logit_bias(bias: dict[str, float]) -> dict[int, float]:
    out = {}
    for key, value in bias.items():
        refuse(not key.lstrip("-").isdigit(), "logit_bias", f"logit_bias key {key!r} is not a "
               "token id")  # fmt: skip
        out[int(key)] = value
    return out


def refuse(cond: bool, param: str, message: str) -> None:
    if cond:
        raise bad_request(message, param)


def _param_of(message: str) -> str | None:
    """The parameter a SamplingParams error names ('invalid sampling parameter top_p=...')."""
    match = re.search(r"parameter ([\w.]+)=", message)
    return match.group(1) if match else None
