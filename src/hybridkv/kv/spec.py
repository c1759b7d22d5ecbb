"""Layer specs and their grouping into a KV cache layout.

Every layer reports a frozen spec (or ``None`` when it keeps no cache, e.g. an MLP-only layer).
``create_layout`` groups them once at start-up; every other part reads the layout.

Attention groups all hold the same number of layers (``group_size``, G) and every attention
layer page is padded to the same size, so one block id means the same bytes in every attention
group and one pool serves them all. Memory placement (what the runner allocates)::

    backing tensor i (i < G), shape [num_blocks, layer_page_bytes]:
        used by the i-th layer of *every* attention group
    block id b of group g  ->  row b of each of group g's G backing tensors

A block id has at most one owner group at a time, which is what makes the aliasing sound.

State layers (Mamba2, Gated DeltaNet, short conv) are not paged by tokens: each state group
(one per distinct state spec, all its layers) owns a pool of *state slots*, a slot holding the
whole recurrent state of every layer of the group for one sequence position.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from math import prod
from typing import TypeVar

DTYPE_BYTES: dict[str, int] = {"float32": 4, "bfloat16": 2, "float16": 2}


def dtype_bytes(dtype: str) -> int:
    try:
        return DTYPE_BYTES[dtype]
    except KeyError:
        raise ValueError(
            f"unsupported KV dtype {dtype!r}; expected one of {sorted(DTYPE_BYTES)}"
        ) from None


class SpecKind(str, Enum):
    FULL = "full_attention"
    SLIDING = "sliding_window"
    STATE = "state"


@dataclass(frozen=True, slots=True)
class FullAttentionSpec:
    """A layer that keeps K and V of every token, paged in blocks of ``block_size`` tokens."""

    block_size: int
    num_kv_heads: int
    head_size: int
    dtype: str

    @property
    def kind(self) -> SpecKind:
        return SpecKind.FULL

    @property
    def page_bytes(self) -> int:
        """Bytes of one block of ONE layer: K and V, ``[2, block_size, heads, head_size]``."""
        return 2 * self.block_size * self.num_kv_heads * self.head_size * dtype_bytes(self.dtype)


@dataclass(frozen=True, slots=True)
class SlidingWindowSpec:
    """A layer whose query at position p attends to positions (p - sliding_window, p]."""

    block_size: int
    num_kv_heads: int
    head_size: int
    dtype: str
    sliding_window: int

    @property
    def kind(self) -> SpecKind:
        return SpecKind.SLIDING

    @property
    def page_bytes(self) -> int:
        return 2 * self.block_size * self.num_kv_heads * self.head_size * dtype_bytes(self.dtype)


@dataclass(frozen=True, slots=True)
class StateSpec:
    """A recurrent layer; ``shapes``/``dtypes`` describe its state tensors (one per entry)."""

    state_kind: str  # "mamba2" | "gated_deltanet" | "short_conv"
    shapes: tuple[tuple[int, ...], ...]
    dtypes: tuple[str, ...]

    def __post_init__(self) -> None:
        if len(self.shapes) != len(self.dtypes):
            raise ValueError("StateSpec needs one dtype per state tensor shape")

    @property
    def kind(self) -> SpecKind:
        return SpecKind.STATE

    @property
    def slot_bytes(self) -> int:
        """Bytes of one state slot of ONE layer (all its state tensors)."""
        return sum(prod(s) * dtype_bytes(d) for s, d in zip(self.shapes, self.dtypes, strict=True))


AttentionSpec = FullAttentionSpec | SlidingWindowSpec
LayerSpec = FullAttentionSpec | SlidingWindowSpec | StateSpec
_S = TypeVar("_S", FullAttentionSpec | SlidingWindowSpec, StateSpec)


@dataclass(frozen=True, slots=True)
class KVCacheGroup:
    group_id: int
    spec: LayerSpec
    layer_ids: tuple[int, ...]

    @property
    def kind(self) -> SpecKind:
        return self.spec.kind


@dataclass(frozen=True, slots=True)
class KVCacheLayout:
    """The grouping of a model's layers; computed once, read by everyone."""

    groups: tuple[KVCacheGroup, ...]
    num_layers: int
    block_size: int
    group_size: int  # G: layers per attention group (short groups are padded)
    layer_page_bytes: int  # bytes of one block of one attention layer (max over groups)

    @property
    def attention_group_ids(self) -> tuple[int, ...]:
        return tuple(g.group_id for g in self.groups if g.kind is not SpecKind.STATE)

    @property
    def state_group_ids(self) -> tuple[int, ...]:
        return tuple(g.group_id for g in self.groups if g.kind is SpecKind.STATE)

    @property
    def page_bytes(self) -> int:
        """Bytes one block id stands for: G layer pages."""
        return self.group_size * self.layer_page_bytes

    @property
    def padding_waste(self) -> float:
        """Fraction of attention memory spent on padding (missing layers, smaller pages)."""
        used = 0
        for g in self.groups:
            if isinstance(g.spec, FullAttentionSpec | SlidingWindowSpec):
                used += len(g.layer_ids) * g.spec.page_bytes
        total = len(self.attention_group_ids) * self.page_bytes
        return 0.0 if total == 0 else 1.0 - used / total

    def state_slot_bytes(self, group_id: int) -> int:
        """Bytes of one state slot of a state group (all its layers)."""
        group = self.groups[group_id]
        if not isinstance(group.spec, StateSpec):
            raise ValueError(f"group {group_id} is not a state group")
        return len(group.layer_ids) * group.spec.slot_bytes

    def total_state_slot_bytes(self) -> int:
        return sum(self.state_slot_bytes(g) for g in self.state_group_ids)

    def num_blocks_for(self, memory_bytes: int, num_state_slots: int) -> int:
        """Blocks (null block included) that fit after ``num_state_slots`` slots per state group."""
        left = memory_bytes - num_state_slots * self.total_state_slot_bytes()
        if not self.attention_group_ids:
            return 1 if left >= 0 else 0
        return max(0, left // self.page_bytes)

    def layer_placement(self, layer_id: int) -> tuple[int, int] | None:
        """(group id, index within the group) of a layer, or None if it keeps no cache.

        For attention groups the index names the backing tensor the layer's pages live in;
        for state groups it names the layer's position inside a state slot.
        """
        for g in self.groups:
            if layer_id in g.layer_ids:
                return g.group_id, g.layer_ids.index(layer_id)
        return None

    def fingerprint(self, model_id: str) -> str:
        """A stable digest of model identity and layout; salts every key that leaves the process."""
        desc = {
            "model": model_id,
            "block_size": self.block_size,
            "group_size": self.group_size,
            "groups": [[g.kind.value, repr(g.spec), list(g.layer_ids)] for g in self.groups],
        }
        blob = json.dumps(desc, sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:32]

    def describe(self) -> str:
        lines = [
            f"{len(self.groups)} groups, block size {self.block_size}, {self.group_size} layers "
            f"per attention group, page {self.page_bytes} bytes, padding waste "
            f"{self.padding_waste:.1%}"
        ]
        for g in self.groups:
            lines.append(f"  group {g.group_id}: {g.kind.value} layers {list(g.layer_ids)}")
        return "\n".join(lines)


def create_layout(specs: Sequence[LayerSpec | None], block_size: int = 16) -> KVCacheLayout:
    """Group per-layer specs (index = layer id) into a layout.

    ``block_size`` is only used by layouts without attention layers (it sets the boundaries
    at which state checkpoints are taken); otherwise the attention specs' block size rules.

    Attention layers with equal specs form buckets; G is the smallest bucket (the "1" of an
    n:1 pattern), or the largest when the largest is < 1.5 x the smallest (fewer padding layers).
    Each bucket is split into groups of G consecutive layers; full attention groups come
    first, then sliding-window groups, then one state group per distinct state spec.
    """
    attn = _buckets(
        [
            (i, s)
            for i, s in enumerate(specs)
            if isinstance(s, FullAttentionSpec | SlidingWindowSpec)
        ]
    )
    state = _buckets([(i, s) for i, s in enumerate(specs) if isinstance(s, StateSpec)])
    block_sizes = {s.block_size for s, _ in attn}
    if len(block_sizes) > 1:
        raise ValueError(f"attention layers disagree on block size: {sorted(block_sizes)}")
    group_size = _group_size([len(ids) for _, ids in attn])
    attn.sort(key=lambda b: 0 if b[0].kind is SpecKind.FULL else 1)
    groups: list[KVCacheGroup] = []
    for spec, ids in attn:
        for start in range(0, len(ids), group_size):
            groups.append(KVCacheGroup(len(groups), spec, tuple(ids[start : start + group_size])))
    for state_spec, state_ids in state:
        groups.append(KVCacheGroup(len(groups), state_spec, tuple(state_ids)))
    layer_page = max((s.page_bytes for s, _ in attn), default=0)
    return KVCacheLayout(
        groups=tuple(groups),
        num_layers=len(specs),
        block_size=block_sizes.pop() if block_sizes else block_size,
        group_size=group_size,
        layer_page_bytes=layer_page,
    )


def _buckets(items: Sequence[tuple[int, _S]]) -> list[tuple[_S, list[int]]]:
    order: dict[_S, list[int]] = {}
    for layer_id, spec in items:
        order.setdefault(spec, []).append(layer_id)
    return list(order.items())


def _group_size(bucket_sizes: Sequence[int]) -> int:
    if not bucket_sizes:
        return 0
    smallest, largest = min(bucket_sizes), max(bucket_sizes)
    return largest if largest < 1.5 * smallest else smallest
