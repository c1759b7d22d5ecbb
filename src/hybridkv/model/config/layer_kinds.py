"""Layer kinds of a checkpoint, normalised from every spelling the Hub has used::

    layer_types            full_attention / sliding_attention / linear_attention (5.x)
                           attention / mamba (legacy)
    layers_block_type      attention / mamba (legacy Granite / Bamba)
    attn_layer_indices     attention layers listed, the rest mamba
    hybrid_override_pattern  Nemotron-H: M mamba, * attention, - mlp, E moe
    falcon_h1              every decoder layer holds a Mamba2 mixer AND attention: two cache
                           layers each (2i mamba, 2i + 1 attention), so ``num_hidden_layers``
                           (and ``layer_kinds``) count cache layers, twice the decoder layers
    use_sliding_window + max_window_layers   Qwen2/3: layers >= max_window_layers slide
    sliding_window_pattern Gemma 3: every n-th layer is full, the others slide

Sliding-window semantics (checked against transformers 5.23 ``sliding_window_overlay``: a key
is visible iff ``kv_idx > q_idx - sliding_window``): the query at position p sees positions
``(p - W, p]``, exactly ``SlidingWindowSpec`` with ``sliding_window = W``; no remapping.

``parse_layer_kinds`` returns exactly one kind per cache layer (``num_cache_layers``) or raises
``ModelLoadError`` naming the unknown type or symbol, or the count that does not match.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import Enum
from typing import Any

from hybridkv.model.config.errors import ModelLoadError
from hybridkv.model.config.json_fields import json_int


class LayerKind(str, Enum):
    FULL = "full_attention"
    SLIDING = "sliding_attention"
    MAMBA = "mamba"
    GDN = "gated_deltanet"  # Qwen3-Next / Qwen3.5 "linear_attention"
    MLP = "mlp"  # no mixer, no cache (Nemotron-H '-' / 'E')


_LAYER_TYPE_NAMES: dict[str, LayerKind] = {
    "full_attention": LayerKind.FULL,
    "attention": LayerKind.FULL,
    "sliding_attention": LayerKind.SLIDING,
    "linear_attention": LayerKind.MAMBA,
    "mamba": LayerKind.MAMBA,
    "mamba2": LayerKind.MAMBA,
    "mlp": LayerKind.MLP,  # Nemotron-H 5.x names
    "moe": LayerKind.MLP,
}
# model types whose "linear_attention" layers are Gated DeltaNet (elsewhere: Mamba2)
_GDN_MODEL_TYPES = frozenset(
    {"qwen3_next", "qwen3_5", "qwen3_5_text", "qwen3_5_moe", "qwen3_5_moe_text"}
)
_PATTERN_CHARS: dict[str, LayerKind] = {
    "M": LayerKind.MAMBA,
    "*": LayerKind.FULL,
    "-": LayerKind.MLP,
    "E": LayerKind.MLP,
}


def num_cache_layers(raw: Mapping[str, Any]) -> int:
    """Cache layers: decoder layers, twice them for Falcon-H1, or Nemotron-H's list length."""
    if raw.get("model_type") == "falcon_h1":
        return 2 * json_int(raw, "num_hidden_layers")
    if raw.get("num_hidden_layers") is None and isinstance(raw.get("layers_block_type"), list):
        return len(raw["layers_block_type"])
    return json_int(raw, "num_hidden_layers")


def parse_layer_kinds(raw: Mapping[str, Any], num_layers: int) -> tuple[LayerKind, ...]:
    kinds = _explicit_kinds(raw, num_layers)
    if kinds is None:
        kinds = _implicit_kinds(raw, num_layers)
    if len(kinds) != num_layers:
        raise ModelLoadError(
            f"config describes {len(kinds)} layer types but num_hidden_layers is {num_layers}"
        )
    if raw.get("model_type") in _GDN_MODEL_TYPES:
        kinds = [LayerKind.GDN if k is LayerKind.MAMBA else k for k in kinds]
    if LayerKind.SLIDING in kinds and (
        not raw.get("sliding_window") or raw.get("use_sliding_window") is False
    ):
        # transformers drops the window (Qwen3 with use_sliding_window=false): layers attend fully
        kinds = [LayerKind.FULL if k is LayerKind.SLIDING else k for k in kinds]
    return tuple(kinds)


def _explicit_kinds(raw: Mapping[str, Any], num_layers: int) -> list[LayerKind] | None:
    if raw.get("model_type") == "falcon_h1":
        return [LayerKind.MAMBA, LayerKind.FULL] * (num_layers // 2)
    names = raw.get("layer_types") or raw.get("layers_block_type")
    if names:
        unknown = sorted({n for n in names if n not in _LAYER_TYPE_NAMES})
        if unknown:
            raise ModelLoadError(f"unsupported layer types {unknown} in config.json")
        return [_LAYER_TYPE_NAMES[n] for n in names]
    pattern = raw.get("hybrid_override_pattern")
    if pattern:
        bad = sorted(set(pattern) - set(_PATTERN_CHARS))
        if bad:
            raise ModelLoadError(f"hybrid_override_pattern has unknown symbols {bad}")
        return [_PATTERN_CHARS[c] for c in pattern]
    if raw.get("attn_layer_indices") is not None:
        attn = set(raw["attn_layer_indices"])
        return [LayerKind.FULL if i in attn else LayerKind.MAMBA for i in range(num_layers)]
    return None


def _implicit_kinds(raw: Mapping[str, Any], num_layers: int) -> list[LayerKind]:
    if raw.get("sliding_window_pattern") or raw.get("model_type") in ("gemma3", "gemma3_text"):
        every = int(raw.get("sliding_window_pattern") or 6)
        return [
            LayerKind.FULL if (i + 1) % every == 0 else LayerKind.SLIDING for i in range(num_layers)
        ]
    if raw.get("model_type") == "granitemoehybrid":  # transformers' default: all mamba
        return [LayerKind.MAMBA] * num_layers
    if raw.get("use_sliding_window") and raw.get("sliding_window"):
        first = int(raw.get("max_window_layers", num_layers))
        return [LayerKind.SLIDING if i >= first else LayerKind.FULL for i in range(num_layers)]
    return [LayerKind.FULL] * num_layers
