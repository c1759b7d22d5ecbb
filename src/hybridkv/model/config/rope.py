"""RoPE parameters from config.json (both the 5.x ``rope_parameters`` and legacy spellings)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from hybridkv.model.config.errors import ModelLoadError

_DEFAULT_THETA = 10_000.0
_GEMMA3_THETA = {"full_attention": 1_000_000.0, "sliding_attention": 10_000.0}


@dataclass(frozen=True, slots=True)
class RopeConfig:
    """``inv_freq[i] = 1 / (theta ** (2i / dim)) / linear_factor``; ``dim`` is the number of
    rotated dims of a head (less than the head with a ``partial_rotary_factor``)."""

    theta: float
    dim: int
    linear_factor: float = 1.0
    yarn: YarnParams | None = None

    def inv_freq(self) -> torch.Tensor:
        """``[dim / 2]`` float32 inverse frequencies (on the CPU)."""
        exponents = torch.arange(0, self.dim, 2, dtype=torch.float32) / self.dim
        base = 1.0 / (self.theta**exponents)
        if self.yarn is None:
            return base / self.linear_factor
        return self.yarn.blend(base, self.theta, self.dim)

    @property
    def attention_scaling(self) -> float:
        """What cos and sin are multiplied by (YaRN's mscale; 1 otherwise)."""
        return 1.0 if self.yarn is None else self.yarn.attention_factor


@dataclass(frozen=True, slots=True)
class YarnParams:
    """YaRN: interpolate low frequencies by ``factor``, keep high ones, ramp between the
    dims that rotate ``beta_slow`` and ``beta_fast`` times over the original context."""

    factor: float
    original_max_positions: int
    beta_fast: float
    beta_slow: float
    truncate: bool
    attention_factor: float

    def blend(self, extrapolated: torch.Tensor, theta: float, dim: int) -> torch.Tensor:
        low, high = (self._dim_of(r, theta, dim) for r in (self.beta_fast, self.beta_slow))
        if self.truncate:
            low, high = math.floor(low), math.ceil(high)
        low, high = max(low, 0), min(high, dim - 1)
        if low == high:
            high += 0.001
        ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
        keep = 1 - ramp  # share of the extrapolated (unscaled) frequency
        return extrapolated / self.factor * (1 - keep) + extrapolated * keep

    def _dim_of(self, rotations: float, theta: float, dim: int) -> float:
        span = self.original_max_positions / (rotations * 2 * math.pi)
        return dim * math.log(span) / (2 * math.log(theta))


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
        params = {**params, "partial_rotary_factor": params.get("partial_rotary_factor", 0.5)}
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
    if kind == "yarn":
        return RopeConfig(theta, head_dim, yarn=_yarn(params))
    raise ModelLoadError(
        f"unsupported RoPE type {kind!r} in config.json; supported: 'default', 'linear', 'yarn'"
    )


def _yarn(params: Mapping[str, Any]) -> YarnParams:
    factor = float(params["factor"])
    attention = params.get("attention_factor")
    if attention is None:
        mscale, mscale_all = params.get("mscale"), params.get("mscale_all_dim")
        if mscale and mscale_all:
            attention = _mscale(factor, float(mscale)) / _mscale(factor, float(mscale_all))
        else:
            attention = _mscale(factor)
    return YarnParams(
        factor=factor,
        original_max_positions=int(params["original_max_position_embeddings"]),
        beta_fast=float(params.get("beta_fast") or 32),
        beta_slow=float(params.get("beta_slow") or 1),
        truncate=bool(params.get("truncate", True)),
        attention_factor=float(attention),
    )


def _mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0
