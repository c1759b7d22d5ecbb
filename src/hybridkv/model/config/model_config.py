"""Our own frozen model config, read from a checkpoint's ``config.json`` (no transformers).

``build_model_config`` builds the ``ModelConfig`` from a parsed ``config.json`` (the loader's
``load_model_config`` reads a checkpoint directory's; ``make_model`` and tests call it
directly). The parts live beside it: file reading and typed fields in ``json_fields.py``,
layer kinds (every spelling the Hub has used, sliding-window semantics) in ``layer_kinds.py``,
Mamba2 sizes in ``mamba.py``, Gated DeltaNet sizes in ``gdn.py``, RoPE in ``rope.py``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from hybridkv.kv.spec import FullAttentionSpec, LayerSpec, SlidingWindowSpec, StateSpec
from hybridkv.model.config.errors import ModelLoadError
from hybridkv.model.config.gdn import GdnConfig, parse_gdn
from hybridkv.model.config.json_fields import json_int, parse_eos_ids
from hybridkv.model.config.layer_kinds import LayerKind, num_cache_layers, parse_layer_kinds
from hybridkv.model.config.mamba import MambaConfig, MambaOutNorm, parse_mamba
from hybridkv.model.config.rope import RopeConfig, parse_rope


@dataclass(frozen=True, slots=True)
class ModelConfig:
    architecture: str
    model_type: str
    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    max_position_embeddings: int
    rms_norm_eps: float
    tie_word_embeddings: bool
    eos_token_ids: tuple[int, ...]
    bos_token_id: int | None
    layer_kinds: tuple[LayerKind, ...]
    sliding_window: int | None
    rope: RopeConfig
    local_rope: RopeConfig | None  # sliding layers' RoPE when it differs (Gemma 3)
    mamba: MambaConfig | None
    gdn: GdnConfig | None
    raw: Mapping[str, Any] = field(compare=False, repr=False)  # config.json, for arch extras

    @property
    def media_token_ids(self) -> frozenset[int]:
        """Image/video placeholder ids of a multimodal checkpoint (we run its text model)."""
        return frozenset(self.raw.get("media_token_ids") or ())

    def layer_specs(self, block_size: int, kv_dtype: str) -> list[LayerSpec | None]:
        """One spec per layer. Mamba state: conv state in ``kv_dtype``, ssm state float32
        (recurrent accumulation in bf16 drifts, so it stays float32 for every model dtype)."""
        specs: list[LayerSpec | None] = []
        for kind in self.layer_kinds:
            specs.append(self._layer_spec(kind, block_size, kv_dtype))
        return specs

    def _layer_spec(self, kind: LayerKind, block_size: int, kv_dtype: str) -> LayerSpec | None:
        if kind is LayerKind.FULL:
            return FullAttentionSpec(block_size, self.num_kv_heads, self.head_dim, kv_dtype)
        if kind is LayerKind.SLIDING:
            assert self.sliding_window is not None
            return SlidingWindowSpec(
                block_size, self.num_kv_heads, self.head_dim, kv_dtype, self.sliding_window
            )
        if kind is LayerKind.MAMBA:
            m = self.mamba
            if m is None:
                raise ModelLoadError(f"{self.architecture}: mamba layers but no mamba_* config")
            shapes = ((m.conv_dim, m.d_conv - 1), (m.num_heads, m.head_dim, m.d_state))
            return StateSpec("mamba2", shapes, (kv_dtype, "float32"))
        if kind is LayerKind.GDN:
            assert self.gdn is not None
            return self.gdn.state_spec(kv_dtype)
        return None


def build_model_config(arch: str, raw: Mapping[str, Any], gen_eos: tuple[int, ...]) -> ModelConfig:
    num_layers = num_cache_layers(raw)
    heads = json_int(raw, "num_attention_heads")
    hidden = json_int(raw, "hidden_size")
    kinds = parse_layer_kinds(raw, num_layers)
    window = raw["sliding_window"] if LayerKind.SLIDING in kinds else None
    head_dim = raw.get("head_dim") or hidden // heads
    rope, local_rope = parse_rope(raw, head_dim)
    return ModelConfig(
        architecture=arch,
        model_type=str(raw.get("model_type", "")),
        vocab_size=json_int(raw, "vocab_size"),
        hidden_size=hidden,
        num_hidden_layers=num_layers,
        num_attention_heads=heads,
        num_kv_heads=int(raw.get("num_key_value_heads") or heads),
        head_dim=int(head_dim),
        max_position_embeddings=int(raw.get("max_position_embeddings", 4096)),
        rms_norm_eps=_norm_eps(raw),
        tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
        eos_token_ids=gen_eos or parse_eos_ids(raw.get("eos_token_id")),
        bos_token_id=raw.get("bos_token_id"),
        layer_kinds=kinds,
        sliding_window=int(window) if window is not None else None,
        rope=rope,
        local_rope=local_rope,
        mamba=parse_mamba(raw, hidden) if LayerKind.MAMBA in kinds else None,
        gdn=parse_gdn(raw) if LayerKind.GDN in kinds else None,
        raw=dict(raw),
    )


def _norm_eps(raw: Mapping[str, Any]) -> float:
    if raw.get("model_type") == "nemotron_h":  # its norms read layer_norm_epsilon only
        return float(raw.get("layer_norm_epsilon", 1e-5))
    return float(raw.get("rms_norm_eps", 1e-6))


# LayerKind and the Mamba types type ModelConfig's fields: importable from here too
__all__ = [
    "LayerKind",
    "MambaConfig",
    "MambaOutNorm",
    "ModelConfig",
    "build_model_config",
]
