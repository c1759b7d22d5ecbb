"""Gated DeltaNet sizes (Qwen3-Next, Qwen3.5 ``linear_attention`` layers) from config.json."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from hybridkv.kv.spec import StateSpec
from hybridkv.model.config.errors import ModelLoadError
from hybridkv.model.config.json_fields import json_int


@dataclass(frozen=True, slots=True)
class GdnConfig:
    """State per layer: the short conv's last inputs ``[conv_dim, d_conv - 1]`` and the
    recurrent state ``[num_v_heads, head_k_dim, head_v_dim]`` (float32)."""

    num_k_heads: int
    num_v_heads: int
    head_k_dim: int
    head_v_dim: int
    d_conv: int

    @property
    def key_dim(self) -> int:
        return self.num_k_heads * self.head_k_dim

    @property
    def value_dim(self) -> int:
        return self.num_v_heads * self.head_v_dim

    @property
    def conv_dim(self) -> int:
        return 2 * self.key_dim + self.value_dim

    def state_spec(self, kv_dtype: str) -> StateSpec:
        shapes = (
            (self.conv_dim, self.d_conv - 1),
            (self.num_v_heads, self.head_k_dim, self.head_v_dim),
        )
        return StateSpec("gated_deltanet", shapes, (kv_dtype, "float32"))


def parse_gdn(raw: Mapping[str, Any]) -> GdnConfig:
    cfg = GdnConfig(
        num_k_heads=json_int(raw, "linear_num_key_heads"),
        num_v_heads=json_int(raw, "linear_num_value_heads"),
        head_k_dim=json_int(raw, "linear_key_head_dim"),
        head_v_dim=json_int(raw, "linear_value_head_dim"),
        d_conv=int(raw.get("linear_conv_kernel_dim", 4)),
    )
    if cfg.num_v_heads % cfg.num_k_heads:
        raise ModelLoadError(
            f"linear_num_value_heads ({cfg.num_v_heads}) must be a multiple of "
            f"linear_num_key_heads ({cfg.num_k_heads})"
        )
    return cfg
