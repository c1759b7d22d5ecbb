"""RoPE parameters from config.json (both the 5.x ``rope_parameters`` and legacy spellings)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from hybridkv.model.errors import ModelLoadError

_DEFAULT_THETA = 10_000.0
_GEMMA3_THETA = {"full_attention": 1_000_000.0, "sliding_attention": 10_000.0}


@dataclass(frozen=True, slots=True)
class RopeConfig:
    """``inv_freq[i] = 1 / (theta ** (2i / dim)) / linear_factor``; ``dim`` is the number of
    rotated dims of a head (less than the head with a ``partial_rotary_factor``)."""

    theta: float
    dim: int
    linear_factor: float = 1.0


def parse_rope(raw: Mapping[str, Any], head_dim: int) -> tuple[RopeConfig, RopeConfig | None]:
    """(RoPE of full layers, RoPE of sliding layers or None when it is the same)."""
    params = raw.get("rope_parameters")
    if raw.get("model_type") in ("gemma3", "gemma3_text"):
        return _gemma3(raw, params, head_dim)
    if not isinstance(params, dict) or not params:
        params = dict(raw.get("rope_scaling") or {})
        if raw.get("partial_rotary_factor") is not None:  # legacy top-level spelling
            params["partial_rotary_factor"] = raw["partial_rotary_factor"]
        if raw.get("model_type") == "bamba":  # transformers fixes it for Bamba
            params.setdefault("partial_rotary_factor", 0.5)
    theta = params.get("rope_theta", raw.get("rope_theta", _DEFAULT_THETA))
    return _one(params, float(theta), head_dim), None


def _gemma3(raw: Mapping[str, Any], params: Any, head_dim: int) -> tuple[RopeConfig, RopeConfig]:
    if isinstance(params, dict) and "full_attention" in params:
        full = params.get("full_attention") or {}
        local = params.get("sliding_attention") or {}
    else:  # legacy: rope_theta, rope_local_base_freq, rope_scaling (applies to full layers)
        full = dict(raw.get("rope_scaling") or {})
        full.setdefault("rope_theta", raw.get("rope_theta", _GEMMA3_THETA["full_attention"]))
        local = {"rope_theta": raw.get("rope_local_base_freq", _GEMMA3_THETA["sliding_attention"])}
    full_theta = float(full.get("rope_theta", _GEMMA3_THETA["full_attention"]))
    local_theta = float(local.get("rope_theta", _GEMMA3_THETA["sliding_attention"]))
    return _one(full, full_theta, head_dim), _one(local, local_theta, head_dim)


def _one(params: Mapping[str, Any], theta: float, head_dim: int) -> RopeConfig:
    kind = params.get("rope_type", params.get("type", "default"))
    head_dim = int(head_dim * float(params.get("partial_rotary_factor", 1.0)))  # rotated dims
    if kind == "default":
        return RopeConfig(theta, head_dim)
    if kind == "linear":
        return RopeConfig(theta, head_dim, float(params["factor"]))
    raise ModelLoadError(
        f"unsupported RoPE type {kind!r} in config.json; supported: 'default', 'linear'"
    )
