"""Sampling parameters of one request, validated where they are built."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """How to pick tokens, and when to stop. Names follow vLLM's.

    ``temperature == 0`` is greedy. ``top_k == 0`` (or -1) and ``top_p == 1`` disable those
    filters. ``seed`` makes a sampled request reproducible on its own. ``logprobs`` asks for the
    log-probability of each chosen token.
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
        _check(
            isinstance(self.max_tokens, int) and self.max_tokens >= 1,
            "max_tokens",
            self.max_tokens,
            "an integer >= 1",
        )
        _check(self.temperature >= 0.0, "temperature", self.temperature, ">= 0")
        _check(
            isinstance(self.top_k, int) and self.top_k >= 0,
            "top_k",
            self.top_k,
            "0 / -1 (off) or a positive integer",
        )
        _check(0.0 < self.top_p <= 1.0, "top_p", self.top_p, "in (0, 1]")
        _check(
            all(isinstance(s, str) and s for s in self.stop), "stop", self.stop, "non-empty strings"
        )
        _check(
            all(isinstance(t, int) and t >= 0 for t in self.stop_token_ids),
            "stop_token_ids",
            self.stop_token_ids,
            "token ids >= 0",
        )
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

    @property
    def kv_transfer_params(self) -> dict[str, object] | None:
        """``extra_args["kv_transfer_params"]`` (vLLM's spelling): what a KV connector reads
        of this request (P/D disaggregation), or None."""
        if not self.extra_args:
            return None
        value = self.extra_args.get("kv_transfer_params")
        return value if isinstance(value, dict) else None

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def _check(ok: bool, name: str, value: object, want: str) -> None:
    if not ok:
        raise ValueError(f"invalid sampling parameter {name}={value!r}: must be {want}")
