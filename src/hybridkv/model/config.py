"""Our own frozen model config, read from a checkpoint's ``config.json`` (no transformers).

Layer kinds are normalised from every spelling the Hub has used::

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
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

from hybridkv.kv.spec import FullAttentionSpec, LayerSpec, SlidingWindowSpec, StateSpec
from hybridkv.model.config_gdn import GdnConfig, parse_gdn
from hybridkv.model.errors import ModelLoadError
from hybridkv.model.rope import RopeConfig, parse_rope


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


_MEDIA_TOKEN_KEYS = ("image_token_index", "image_token_id", "video_token_id")


def read_config_json(model_dir: Path) -> dict[str, Any]:
    if not model_dir.is_dir():
        raise ModelLoadError(f"model directory {str(model_dir)!r} does not exist")
    path = model_dir / "config.json"
    if not path.is_file():
        raise ModelLoadError(
            f"{str(model_dir)!r} has no config.json (not a Hugging Face checkpoint?)"
        )
    try:
        raw = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ModelLoadError(f"{path} is not valid JSON: {exc}") from None
    if not isinstance(raw, dict):
        raise ModelLoadError(f"{path} must hold a JSON object")
    if isinstance(raw.get("text_config"), dict):  # multimodal wrapper: read the text part
        media = [raw[k] for k in _MEDIA_TOKEN_KEYS if isinstance(raw.get(k), int)]
        raw = {**raw["text_config"], "architectures": raw.get("architectures")}
        raw["media_token_ids"] = media  # placeholders only the vision tower could fill
    return raw


def load_model_config(model_dir: str | Path) -> ModelConfig:
    """Read and validate ``config.json`` (+ ``generation_config.json``) of a checkpoint dir."""
    from hybridkv.model.registry import check_architecture

    model_dir = Path(model_dir)
    raw = read_config_json(model_dir)
    arch = check_architecture(raw.get("architectures"))
    return build_model_config(arch, raw, _generation_eos(model_dir))


def build_model_config(arch: str, raw: Mapping[str, Any], gen_eos: tuple[int, ...]) -> ModelConfig:
    num_layers = _num_layers(raw)
    heads = _int(raw, "num_attention_heads")
    hidden = _int(raw, "hidden_size")
    kinds = parse_layer_kinds(raw, num_layers)
    window = raw["sliding_window"] if LayerKind.SLIDING in kinds else None
    head_dim = raw.get("head_dim") or hidden // heads
    rope, local_rope = parse_rope(raw, head_dim)
    return ModelConfig(
        architecture=arch,
        model_type=str(raw.get("model_type", "")),
        vocab_size=_int(raw, "vocab_size"),
        hidden_size=hidden,
        num_hidden_layers=num_layers,
        num_attention_heads=heads,
        num_kv_heads=int(raw.get("num_key_value_heads") or heads),
        head_dim=int(head_dim),
        max_position_embeddings=int(raw.get("max_position_embeddings", 4096)),
        rms_norm_eps=_norm_eps(raw),
        tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
        eos_token_ids=gen_eos or _as_ids(raw.get("eos_token_id")),
        bos_token_id=raw.get("bos_token_id"),
        layer_kinds=kinds,
        sliding_window=int(window) if window is not None else None,
        rope=rope,
        local_rope=local_rope,
        mamba=_parse_mamba(raw, hidden) if LayerKind.MAMBA in kinds else None,
        gdn=parse_gdn(raw) if LayerKind.GDN in kinds else None,
        raw=dict(raw),
    )


def _norm_eps(raw: Mapping[str, Any]) -> float:
    if raw.get("model_type") == "nemotron_h":  # its norms read layer_norm_epsilon only
        return float(raw.get("layer_norm_epsilon", 1e-5))
    return float(raw.get("rms_norm_eps", 1e-6))


def _num_layers(raw: Mapping[str, Any]) -> int:
    """Cache layers: decoder layers, twice them for Falcon-H1, or Nemotron-H's list length."""
    if raw.get("model_type") == "falcon_h1":
        return 2 * _int(raw, "num_hidden_layers")
    if raw.get("num_hidden_layers") is None and isinstance(raw.get("layers_block_type"), list):
        return len(raw["layers_block_type"])
    return _int(raw, "num_hidden_layers")


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


def _parse_mamba(raw: Mapping[str, Any], hidden: int) -> MambaConfig:
    if raw.get("model_type") == "nemotron_h":
        return _parse_nemotron_mamba(raw)
    heads = _int(raw, "mamba_n_heads")
    head_dim = raw.get("mamba_d_head", "auto")
    if head_dim in (None, "auto"):
        inner = raw.get("mamba_d_ssm") or int(raw.get("mamba_expand", 2)) * hidden
        head_dim = int(inner) // heads
    limit = raw.get("time_step_limit") or (0.0, float("inf"))
    return MambaConfig(
        num_heads=heads,
        head_dim=int(head_dim),
        d_state=_int(raw, "mamba_d_state"),
        n_groups=int(raw.get("mamba_n_groups", 1)),
        d_conv=int(raw.get("mamba_d_conv", 4)),
        chunk_size=int(raw.get("mamba_chunk_size", 256)),
        conv_bias=bool(raw.get("mamba_conv_bias", True)),
        proj_bias=bool(raw.get("mamba_proj_bias", False)),
        dt_min=_json_float(limit[0]),
        dt_max=_json_float(limit[1]),
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
        num_heads=_int(raw, "mamba_num_heads"),
        head_dim=_int(raw, "mamba_head_dim"),
        d_state=_int(raw, "ssm_state_size"),
        n_groups=int(raw.get("n_groups", 8)),
        d_conv=int(raw.get("conv_kernel", 4)),
        chunk_size=int(raw.get("chunk_size", 128)),
        conv_bias=bool(raw.get("use_conv_bias", True)),
        proj_bias=bool(raw.get("use_bias", False)),
        dt_min=float(raw.get("time_step_min", 0.001)),
        dt_max=float("inf"),
    )


def _json_float(value: object) -> float:
    """A float, also in transformers 5's encoding of non-finite values ``{"__float__": "Infinity"}``."""
    if isinstance(value, dict):
        value = value.get("__float__")
    if isinstance(value, int | float | str):
        return float(value)
    raise ModelLoadError(f"config.json: expected a number, got {value!r}")


def _generation_eos(model_dir: Path) -> tuple[int, ...]:
    path = model_dir / "generation_config.json"
    if not path.is_file():
        return ()
    try:
        return _as_ids(json.loads(path.read_text()).get("eos_token_id"))
    except (json.JSONDecodeError, AttributeError):
        raise ModelLoadError(f"{path} is not a valid generation config") from None


def _as_ids(value: object) -> tuple[int, ...]:
    if value is None:
        return ()
    if isinstance(value, int):
        return (value,)
    if isinstance(value, list):
        return tuple(int(v) for v in value)
    raise ModelLoadError(f"eos_token_id must be an int or a list of ints, got {value!r}")


def _int(raw: Mapping[str, Any], key: str) -> int:
    value = raw.get(key)
    if not isinstance(value, int) or isinstance(value, bool):
        raise ModelLoadError(f"config.json: {key!r} must be an integer, got {value!r}")
    return value
