"""Sampling parameters of one request, validated where they are built.

The server and ``LLM.generate`` both build ``SamplingParams``, so both accept the same values:
finite numbers only, no ``bool`` passing as an ``int``, and bounded stop lists (a stop list is
checked against the output text every step, so its size is engine time).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

# Temperatures below this are greedy; up to MIN_SAMPLING_TEMPERATURE they are raised to it
# (vLLM's rule: dividing logits by 1e-40 overflows to inf and samples token 0 every time).
GREEDY_TEMPERATURE_EPS = 1e-5
MIN_SAMPLING_TEMPERATURE = 1e-2
MAX_STOP_STRINGS = 64  # OpenAI allows 4; vLLM leaves it open
MAX_STOP_CHARS = 4096  # all stop strings together
MAX_STOP_TOKEN_IDS = 1024
MAX_CACHE_BOUNDARIES = 4096  # extra_args["cache_boundaries"]: positions to checkpoint state at


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """How to pick tokens, and when to stop. Names follow vLLM's.

    ``temperature == 0`` is greedy (as is any temperature below ``GREEDY_TEMPERATURE_EPS``).
    ``top_k == 0`` (or -1) and ``top_p == 1`` disable those filters. ``seed`` makes a sampled
    request reproducible on its own. ``logprobs`` asks for the log-probability of each chosen
    token. ``stop`` holds at most ``MAX_STOP_STRINGS`` strings of ``MAX_STOP_CHARS`` in all.
    """

    max_tokens: int = 16
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    logprobs: bool = False
    extra: dict[str, object] = field(default_factory=dict, compare=False)
    extra_args: dict[str, object] | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            object.__setattr__(self, "stop", (self.stop,))
        object.__setattr__(self, "stop", tuple(self.stop))
        object.__setattr__(self, "stop_token_ids", tuple(self.stop_token_ids))
        if self.top_k == -1:
            object.__setattr__(self, "top_k", 0)
        self._check_numbers()
        self._check_stops()
        self._check_extra_args()
        object.__setattr__(self, "temperature", _effective_temperature(self.temperature))

    def _check_numbers(self) -> None:
        _check(
            _is_int(self.max_tokens) and self.max_tokens >= 1,
            "max_tokens",
            self.max_tokens,
            "an integer >= 1",
        )
        _check(
            _is_real(self.temperature) and self.temperature >= 0.0,
            "temperature",
            self.temperature,
            "a finite number >= 0",
        )
        _check(
            _is_int(self.top_k) and self.top_k >= 0,
            "top_k",
            self.top_k,
            "0 / -1 (off) or a positive integer",
        )
        _check(_is_real(self.top_p) and 0.0 < self.top_p <= 1.0, "top_p", self.top_p, "in (0, 1]")
        _check(self.seed is None or _is_int(self.seed), "seed", self.seed, "an integer")
        _check(isinstance(self.ignore_eos, bool), "ignore_eos", self.ignore_eos, "a bool")
        _check(isinstance(self.logprobs, bool), "logprobs", self.logprobs, "a bool")

    def _check_stops(self) -> None:
        stop, ids = self.stop, self.stop_token_ids
        _check(len(stop) <= MAX_STOP_STRINGS, "stop", stop, f"at most {MAX_STOP_STRINGS} strings")
        _check(all(isinstance(s, str) and s for s in stop), "stop", stop, "non-empty strings")
        _check(
            sum(len(s) for s in stop) <= MAX_STOP_CHARS,
            "stop",
            stop,
            f"at most {MAX_STOP_CHARS} characters in all",
        )
        _check(
            len(ids) <= MAX_STOP_TOKEN_IDS,
            "stop_token_ids",
            ids,
            f"at most {MAX_STOP_TOKEN_IDS} ids",
        )
        _check(all(_is_int(t) and t >= 0 for t in ids), "stop_token_ids", ids, "token ids >= 0")

    def _check_extra_args(self) -> None:
        _check(
            self.extra_args is None or isinstance(self.extra_args, dict),
            "extra_args",
            self.extra_args,
            "a dict",
        )
        transfer = (self.extra_args or {}).get("kv_transfer_params")
        _check(
            transfer is None or isinstance(transfer, dict),
            "kv_transfer_params",
            transfer,
            "an object (dict)",
        )
        bounds = (self.extra_args or {}).get("cache_boundaries")
        _check(
            bounds is None
            or (
                isinstance(bounds, list | tuple)
                and len(bounds) <= MAX_CACHE_BOUNDARIES
                and all(_is_int(t) and t >= 0 for t in bounds)
            ),
            "cache_boundaries",
            bounds,
            f"a list of at most {MAX_CACHE_BOUNDARIES} non-negative integers (token positions)",
        )

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


def _effective_temperature(temperature: float) -> float:
    if temperature < GREEDY_TEMPERATURE_EPS:
        return 0.0
    return max(float(temperature), MIN_SAMPLING_TEMPERATURE)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_real(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _check(ok: bool, name: str, value: object, want: str) -> None:
    if not ok:
        raise ValueError(f"invalid sampling parameter {name}={_short(value)}: must be {want}")


def _short(value: object, limit: int = 120) -> str:
    """``repr(value)``, cut: a hostile value (300,000 stop strings) must not fill the error."""
    text = repr(value)
    if isinstance(value, tuple | list) and len(value) > 8:
        text = f"<{len(value)} items>"
    return text if len(text) <= limit else text[:limit] + "..."
