"""Sampling parameters of one request, validated where they are built.

The server and ``LLM.generate`` both build ``SamplingParams``, so both accept the same values:
finite numbers only, no ``bool`` passing as an ``int``, and bounded stop lists (a stop list is
checked against the output text every step, so its size is engine time). Names, defaults and
meanings are vLLM's (``docs/sampling.md``); ids are checked against the vocabulary when the
engine adds the request (``check_vocab``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hybridkv.sampling.checks import check, check_range, check_token_ids, is_int, is_real
from hybridkv.sampling.structured import StructuredOutputsParams
from hybridkv.sampling.transfer_params import TransferFields, parse_transfer_params

__all__ = ["SamplingParams", "StructuredOutputsParams", "TransferFields"]

# Temperatures below this are greedy; up to MIN_SAMPLING_TEMPERATURE they are raised to it
# (vLLM's rule: dividing logits by 1e-40 overflows to inf and samples token 0 every time).
GREEDY_TEMPERATURE_EPS = 1e-5
MIN_SAMPLING_TEMPERATURE = 1e-2
MAX_STOP_STRINGS = 64  # OpenAI allows 4; vLLM leaves it open
MAX_STOP_CHARS = 4096  # all stop strings together
MAX_STOP_TOKEN_IDS = 1024
MAX_CACHE_BOUNDARIES = 4096  # extra_args["cache_boundaries"]: positions to checkpoint state at
MAX_N = 128  # completions per request
MAX_TOKEN_LIST = 1 << 17  # logit_bias entries, allowed_token_ids
MAX_BAD_WORDS = 1024


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """How to pick tokens, and when to stop. Names and defaults follow vLLM's.

    ``temperature == 0`` is greedy (as is any temperature below ``GREEDY_TEMPERATURE_EPS``).
    ``top_k == 0`` (or -1), ``top_p == 1`` and ``min_p == 0`` disable those filters. ``seed``
    makes a sampled request reproducible on its own (child i of ``n`` uses ``seed + i``).
    ``logprobs=k`` returns, per generated token, the chosen token and the k most likely
    (``True`` means 0: the chosen token only); ``prompt_logprobs=k`` the same per prompt token.
    ``max_tokens=None`` generates until the context is full. ``stop`` holds at most
    ``MAX_STOP_STRINGS`` strings of ``MAX_STOP_CHARS`` in all.
    """

    max_tokens: int | None = 16
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    logprobs: int | None = None
    extra: dict[str, object] = field(default_factory=dict, compare=False)
    extra_args: dict[str, object] | None = field(default=None, compare=False)
    n: int = 1
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    min_p: float = 0.0
    min_tokens: int = 0
    logit_bias: dict[int, float] | None = None
    allowed_token_ids: tuple[int, ...] | None = None
    bad_words: tuple[str, ...] | None = None
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    truncate_prompt_tokens: int | None = None
    prompt_logprobs: int | None = None
    structured_outputs: StructuredOutputsParams | None = None
    # ``bad_words`` as token ids, filled by the engine from its tokenizer (vLLM keeps them as
    # ``_bad_words_token_ids``): each word alone and after a space
    bad_words_token_ids: tuple[tuple[int, ...], ...] | None = field(
        default=None, compare=False, repr=False
    )
    # ``extra_args["kv_transfer_params"]`` parsed once, here (None: none or empty): the only
    # form a KV connector reads
    transfer_fields: TransferFields | None = field(
        default=None, init=False, compare=False, repr=False
    )

    def __post_init__(self) -> None:
        self._normalise()
        self._check_numbers()
        self._check_options()
        self._check_stops()
        self._check_token_lists()
        self._check_extra_args()
        object.__setattr__(self, "temperature", _effective_temperature(self.temperature))

    def _normalise(self) -> None:
        setattr_ = object.__setattr__
        if self.stop is None or isinstance(self.stop, str):
            setattr_(self, "stop", () if self.stop is None else (self.stop,))
        setattr_(self, "stop", tuple(self.stop))
        setattr_(self, "stop_token_ids", tuple(self.stop_token_ids or ()))
        if self.top_k == -1:
            setattr_(self, "top_k", 0)
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(self, name)
            if isinstance(value, bool):  # our old bool: True was "the chosen token only"
                setattr_(self, name, 0 if value else None)
        if isinstance(self.bad_words, str):
            setattr_(self, "bad_words", (self.bad_words,))
        for name in ("allowed_token_ids", "bad_words"):
            value = getattr(self, name)
            if value is not None:
                setattr_(self, name, tuple(value))
        if self.logit_bias is not None and isinstance(self.logit_bias, dict):
            setattr_(self, "logit_bias", _int_keys(self.logit_bias))

    def _check_numbers(self) -> None:
        mt = self.max_tokens
        check(mt is None or (is_int(mt) and mt >= 1), "max_tokens", mt, "an integer >= 1 or None")
        check(is_real(self.temperature) and self.temperature >= 0.0, "temperature",
              self.temperature, "a finite number >= 0")  # fmt: skip
        check(is_int(self.top_k) and self.top_k >= 0, "top_k", self.top_k,
              "0 / -1 (off) or a positive integer")  # fmt: skip
        check(is_real(self.top_p) and 0.0 < self.top_p <= 1.0, "top_p", self.top_p, "in (0, 1]")
        check_range("min_p", self.min_p, 0.0, 1.0)
        check_range("presence_penalty", self.presence_penalty, -2.0, 2.0)
        check_range("frequency_penalty", self.frequency_penalty, -2.0, 2.0)
        rp = self.repetition_penalty
        check(is_real(rp) and rp > 0.0, "repetition_penalty", rp, "a finite number > 0")
        check(self.seed is None or is_int(self.seed), "seed", self.seed, "an integer")
        check(is_int(self.n) and 1 <= self.n <= MAX_N, "n", self.n, f"an integer in [1, {MAX_N}]")
        check(is_int(self.min_tokens) and self.min_tokens >= 0, "min_tokens", self.min_tokens,
              "an integer >= 0")  # fmt: skip
        check(mt is None or self.min_tokens <= mt, "min_tokens", self.min_tokens,
              f"<= max_tokens={mt}")  # fmt: skip
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(self, name)
            check(value is None or (is_int(value) and value >= 0), name, value,
                  "None or an integer >= 0 (how many top tokens per position)")  # fmt: skip
        tpt = self.truncate_prompt_tokens
        check(tpt is None or (is_int(tpt) and (tpt >= 1 or tpt == -1)), "truncate_prompt_tokens",
              tpt, "None, -1 (the model's limit) or an integer >= 1")  # fmt: skip

    def _check_options(self) -> None:
        for name in ("ignore_eos", "include_stop_str_in_output", "skip_special_tokens",
                     "spaces_between_special_tokens"):  # fmt: skip
            check(isinstance(getattr(self, name), bool), name, getattr(self, name), "a bool")
        so = self.structured_outputs
        check(so is None or isinstance(so, StructuredOutputsParams), "structured_outputs", so,
              "a StructuredOutputsParams")  # fmt: skip

    def _check_stops(self) -> None:
        stop = self.stop
        check(len(stop) <= MAX_STOP_STRINGS, "stop", stop, f"at most {MAX_STOP_STRINGS} strings")
        check(all(isinstance(s, str) and s for s in stop), "stop", stop, "non-empty strings")
        check(sum(len(s) for s in stop) <= MAX_STOP_CHARS, "stop", stop,
              f"at most {MAX_STOP_CHARS} characters in all")  # fmt: skip
        check_token_ids("stop_token_ids", self.stop_token_ids, MAX_STOP_TOKEN_IDS)

    def _check_token_lists(self) -> None:
        bias = self.logit_bias
        check(bias is None or isinstance(bias, dict), "logit_bias", bias, "a dict of id -> bias")
        if bias:
            check_token_ids("logit_bias", tuple(bias), MAX_TOKEN_LIST)
            check(all(is_real(v) for v in bias.values()), "logit_bias", bias,
                  "finite biases")  # fmt: skip
        if self.allowed_token_ids is not None:
            check(bool(self.allowed_token_ids), "allowed_token_ids", self.allowed_token_ids,
                  "a non-empty list of token ids")  # fmt: skip
            check_token_ids("allowed_token_ids", self.allowed_token_ids, MAX_TOKEN_LIST)
        words = self.bad_words
        if words is not None:
            check(len(words) <= MAX_BAD_WORDS, "bad_words", words, f"at most {MAX_BAD_WORDS}")
            check(all(isinstance(w, str) and w for w in words), "bad_words", words,
                  "non-empty strings")  # fmt: skip

    def _check_extra_args(self) -> None:
        check(self.extra_args is None or isinstance(self.extra_args, dict), "extra_args",
              self.extra_args, "a dict")  # fmt: skip
        transfer = (self.extra_args or {}).get("kv_transfer_params")
        if transfer is not None:  # typed and bounded, or a ValueError naming the field
            fields = parse_transfer_params(transfer)
            object.__setattr__(self, "transfer_fields", fields if transfer else None)
        bounds = (self.extra_args or {}).get("cache_boundaries")
        check(
            bounds is None
            or (
                isinstance(bounds, list | tuple)
                and len(bounds) <= MAX_CACHE_BOUNDARIES
                and all(is_int(t) and t >= 0 for t in bounds)
            ),
            "cache_boundaries",
            bounds,
            f"a list of at most {MAX_CACHE_BOUNDARIES} non-negative integers (token positions)",
        )

    def check_vocab(self, vocab_size: int) -> None:
        """Token ids the request names must be in ``[0, vocab_size)`` (checked at add)."""
        for name in ("stop_token_ids", "allowed_token_ids", "logit_bias"):
            ids = getattr(self, name) or ()
            bad = [t for t in ids if t >= vocab_size]
            check(not bad, name, bad, f"token ids below the vocabulary size {vocab_size}")

    @property
    def kv_transfer_params(self) -> dict[str, object] | None:
        """``extra_args["kv_transfer_params"]`` (vLLM's spelling): what a KV connector reads
        of this request (P/D disaggregation), or None."""
        if not self.extra_args:
            return None
        value = self.extra_args.get("kv_transfer_params")
        return value if isinstance(value, dict) else None

    @property
    def cache_boundaries(self) -> tuple[int, ...]:
        """``extra_args["cache_boundaries"]``: prompt positions where a later request is
        expected to share this one's prefix (a state checkpoint is kept there)."""
        bounds = (self.extra_args or {}).get("cache_boundaries")
        return tuple(bounds) if isinstance(bounds, list | tuple) else ()

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def has_penalties(self) -> bool:
        return (self.presence_penalty != 0.0 or self.frequency_penalty != 0.0
                or self.repetition_penalty != 1.0)  # fmt: skip

    @property
    def needs_processing(self) -> bool:
        """Whether anything besides temperature/min-p/top-k/top-p changes the logits (the
        sampler's fast path skips the logits processors otherwise)."""
        return bool(
            self.has_penalties or self.min_tokens > 0 or self.logit_bias
            or self.allowed_token_ids is not None or self.bad_words
            or self.structured_outputs is not None
        )  # fmt: skip


def _int_keys(bias: dict[Any, Any]) -> dict[int, float]:
    """JSON gives ``logit_bias`` keys as strings ("50256"); vLLM's are ints."""
    out: dict[int, float] = {}
    for key, value in bias.items():
        if isinstance(key, str) and key.strip().lstrip("-").isdigit():
            key = int(key)
        check(is_int(key), "logit_bias", key, "keyed by token ids")
        out[key] = value
    return out


def _effective_temperature(temperature: float) -> float:
    if temperature < GREEDY_TEMPERATURE_EPS:
        return 0.0
    return max(float(temperature), MIN_SAMPLING_TEMPERATURE)
