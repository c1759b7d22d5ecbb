"""Mamba2 mixer sizes from config.json (Mamba2, Granite, Bamba, Falcon-H1, Nemotron-H names).

``parse_mamba`` reads the model type's own key names and raises ``ModelLoadError`` naming a
missing or mistyped required key; an absent optional key takes its default.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any

from hybridkv.model.config.json_fields import json_float, json_int


class MambaOutNorm(str, Enum):
    """How the scan output meets the gate ``z`` before ``out_proj``."""

    GATE_THEN_NORM = "gate_then_norm"  # rmsnorm(y * silu(z)) per group (Mamba2, Granite)
    NORM_THEN_GATE = "norm_then_gate"  # rmsnorm(y) * silu(z) (Falcon-H1 norm_before_gate)
    GATE_ONLY = "gate_only"  # y * silu(z), no norm (Falcon-H1 mamba_rms_norm=false)


@dataclass(frozen=True, slots=True)
class MambaConfig:
    """Mamba2 mixer sizes; state per layer is conv ``[conv_dim, d_conv - 1]`` + ssm."""

    num_heads: int
    head_dim: int
    d_state: int
    n_groups: int
    d_conv: int
    chunk_size: int
    conv_bias: bool
    proj_bias: bool
    dt_min: float
    dt_max: float
    out_norm: MambaOutNorm = MambaOutNorm.GATE_THEN_NORM

    @property
    def intermediate_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def conv_dim(self) -> int:
        return self.intermediate_size + 2 * self.n_groups * self.d_state


def parse_mamba(raw: Mapping[str, Any], hidden: int) -> MambaConfig:
    if raw.get("model_type") == "nemotron_h":
        return _parse_nemotron_mamba(raw)
    heads = json_int(raw, "mamba_n_heads")
    head_dim = raw.get("mamba_d_head", "auto")
    if head_dim in (None, "auto"):
        inner = raw.get("mamba_d_ssm") or int(raw.get("mamba_expand", 2)) * hidden
        head_dim = int(inner) // heads
    limit = raw.get("time_step_limit") or (0.0, float("inf"))
    return MambaConfig(
        num_heads=heads,
        head_dim=int(head_dim),
        d_state=json_int(raw, "mamba_d_state"),
        n_groups=int(raw.get("mamba_n_groups", 1)),
        d_conv=int(raw.get("mamba_d_conv", 4)),
        chunk_size=int(raw.get("mamba_chunk_size", 256)),
        conv_bias=bool(raw.get("mamba_conv_bias", True)),
        proj_bias=bool(raw.get("mamba_proj_bias", False)),
        dt_min=json_float(limit[0]),
        dt_max=json_float(limit[1]),
        out_norm=_falcon_out_norm(raw),
    )


def _falcon_out_norm(raw: Mapping[str, Any]) -> MambaOutNorm:
    if raw.get("model_type") != "falcon_h1":
        return MambaOutNorm.GATE_THEN_NORM
    if not raw.get("mamba_rms_norm", False):
        return MambaOutNorm.GATE_ONLY
    if raw.get("mamba_norm_before_gate", True):
        return MambaOutNorm.NORM_THEN_GATE
    return MambaOutNorm.GATE_THEN_NORM


def _parse_nemotron_mamba(raw: Mapping[str, Any]) -> MambaConfig:
    """Nemotron-H's names; its mixer clamps dt to ``[time_step_min, inf)`` (transformers 5.23)."""
    return MambaConfig(
        num_heads=json_int(raw, "mamba_num_heads"),
        head_dim=json_int(raw, "mamba_head_dim"),
        d_state=json_int(raw, "ssm_state_size"),
        n_groups=int(raw.get("n_groups", 8)),
        d_conv=int(raw.get("conv_kernel", 4)),
        chunk_size=int(raw.get("chunk_size", 128)),
        conv_bias=bool(raw.get("use_conv_bias", True)),
        proj_bias=bool(raw.get("use_bias", False)),
        dt_min=float(raw.get("time_step_min", 0.001)),
        dt_max=float("inf"),
    )
