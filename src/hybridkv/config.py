"""One frozen engine config made of typed sub-configs, built and validated at the boundary.

Flat option names follow vLLM's (``max_num_seqs``, ``kv_cache_memory``...); each field's
``help`` metadata becomes the CLI's ``--help``. Unknown or invalid options are errors that name
the option.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from hybridkv.connectors.config import KVTransferConfig
from hybridkv.connectors.registry import parse_kv_transfer_config
from hybridkv.kv_events.config import KVEventsConfig, parse_kv_events_config
from hybridkv.paths import parse_bytes

# where a bfloat16 model's products run (``hybridkv.model.loading.matmul``)
BF16_MATMUL_CHOICES = ("auto", "native", "float32")


def _opt(default: Any, help: str) -> Any:
    return field(default=default, metadata={"help": help})


@dataclass(frozen=True, slots=True)
class CacheConfig:
    block_size: int = _opt(16, "tokens per KV block (all attention groups)")
    kv_cache_memory: int = _opt(
        1024**3, "bytes for KV blocks and state slots (KiB/MiB/GiB suffixes)"
    )
    enable_prefix_caching: bool = _opt(True, "reuse KV of shared prefixes")
    prefix_caching_hash_algo: str = _opt("sha256", "block hash function: sha256 or xxh3_128")
    state_checkpoint_interval: int = _opt(
        512, "tokens between recurrent-state checkpoints (0: off)"
    )
    num_state_slots: int | None = _opt(
        None, "state slots per state group (default: from max_num_seqs)"
    )
    state_checkpoint_budget: float = _opt(
        0.1, "most of kv_cache_memory that state checkpoints may take, in (0, 1]"
    )

    def __post_init__(self) -> None:
        _require_int_fields(self)
        _require(self.block_size >= 1, "block_size", self.block_size, "a positive integer")
        _require(self.prefix_caching_hash_algo in ("sha256", "xxh3_128"), "prefix_caching_hash_algo",
                 self.prefix_caching_hash_algo, "sha256 or xxh3_128")  # fmt: skip
        ok = (
            self.state_checkpoint_interval >= 0
            and self.state_checkpoint_interval % self.block_size == 0
        )
        _require(
            ok,
            "state_checkpoint_interval",
            self.state_checkpoint_interval,
            "0 or a multiple of block_size",
        )
        _require(self.num_state_slots is None or self.num_state_slots >= 1, "num_state_slots",
                 self.num_state_slots, "a positive integer")  # fmt: skip
        budget = self.state_checkpoint_budget
        ok_budget = isinstance(budget, int | float) and not isinstance(budget, bool)
        _require(ok_budget and 0.0 < budget <= 1.0, "state_checkpoint_budget", budget,
                 "a fraction of kv_cache_memory in (0, 1]")  # fmt: skip


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    max_num_seqs: int = _opt(64, "most requests running at once")
    max_num_batched_tokens: int = _opt(2048, "token budget of one step (chunked prefill)")
    max_model_len: int | None = _opt(None, "longest prompt + output (default: the model's)")

    def __post_init__(self) -> None:
        _require_int_fields(self)
        _require(self.max_num_seqs >= 1, "max_num_seqs", self.max_num_seqs, "a positive integer")
        _require(
            self.max_num_batched_tokens >= 1,
            "max_num_batched_tokens",
            self.max_num_batched_tokens,
            "a positive integer",
        )
        _require(
            self.max_model_len is None or self.max_model_len >= 2,
            "max_model_len",
            self.max_model_len,
            "an integer >= 2",
        )


@dataclass(frozen=True, slots=True)
class EngineConfig:
    model: str
    dtype: str = "auto"
    bf16_matmul: str = "auto"  # where a bfloat16 model multiplies: auto, native, float32
    seed: int = 0
    cache: CacheConfig = field(default_factory=CacheConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    kv_transfer_config: KVTransferConfig | None = None  # parsed by ``create`` (see below)
    kv_events_config: KVEventsConfig | None = None  # vLLM's --kv-events-config (``kv_events/``)

    def __post_init__(self) -> None:
        _require_int_fields(self)
        _require(
            self.dtype in ("auto", "float32", "bfloat16"),
            "dtype",
            self.dtype,
            "auto, float32 or bfloat16",
        )
        _require(
            self.bf16_matmul in BF16_MATMUL_CHOICES,
            "bf16_matmul",
            self.bf16_matmul,
            ", ".join(BF16_MATMUL_CHOICES),
        )
        if not isinstance(self.kv_transfer_config, KVTransferConfig | None):
            raise TypeError("kv_transfer_config must be parsed: build with EngineConfig.create")
        if not isinstance(self.kv_events_config, KVEventsConfig | None):
            raise TypeError("kv_events_config must be parsed: build with EngineConfig.create")

    @classmethod
    def create(cls, model: str, **options: Any) -> EngineConfig:
        """Build from flat vLLM-style options; unknown names are errors. A
        ``kv_transfer_config`` (dict, JSON string or ``KVTransferConfig``) is parsed here with
        its connector's options, so a bad connector option fails before the model loads."""
        sub: dict[type[Any], dict[str, Any]] = {CacheConfig: {}, SchedulerConfig: {}}
        top: dict[str, Any] = {}
        for name, value in options.items():
            if value is None:
                continue
            target = _owner_of(name)
            if name == "kv_cache_memory":
                value = parse_bytes(value, "kv_cache_memory")
            (top if target is None else sub[target])[name] = value
        cache = CacheConfig(**sub[CacheConfig])
        if "kv_transfer_config" in top:
            top["kv_transfer_config"] = parse_kv_transfer_config(
                top["kv_transfer_config"], cache.block_size
            )
        if "kv_events_config" in top:
            top["kv_events_config"] = parse_kv_events_config(top["kv_events_config"])
        return cls(model=model, cache=cache, scheduler=SchedulerConfig(**sub[SchedulerConfig]),
                   **top)  # fmt: skip


_TOP_LEVEL = {"dtype", "bf16_matmul", "seed", "kv_transfer_config", "kv_events_config"}


def _owner_of(name: str) -> type[Any] | None:
    for sub in (CacheConfig, SchedulerConfig):
        if name in {f.name for f in fields(sub)}:
            return sub
    if name in _TOP_LEVEL:
        return None
    known = sorted({f.name for s in (CacheConfig, SchedulerConfig) for f in fields(s)} | _TOP_LEVEL)
    raise ValueError(f"unknown engine option {name!r}; known options: {', '.join(known)}")


def _require_int_fields(config: Any) -> None:
    """Integer options are integers: not ``True``, not ``2.5``, not NaN (which passes every
    range check)."""
    for f in fields(config):
        value = getattr(config, f.name)
        if f.type in ("int", "int | None") and value is not None:
            is_int = isinstance(value, int) and not isinstance(value, bool)
            _require(is_int, f.name, value, "an integer")


def _require(ok: bool, name: str, value: object, want: str) -> None:
    if not ok:
        raise ValueError(f"invalid engine option {name}={value!r}: must be {want}")
