"""Every spelling of the layer pattern parses to the right layer specs."""

from __future__ import annotations

from typing import Any

import pytest

from hybridkv.kv.spec import FullAttentionSpec, SlidingWindowSpec, StateSpec, create_layout
from hybridkv.model.config.errors import ModelLoadError
from hybridkv.model.config.model_config import LayerKind, build_model_config

F, S, M, N = LayerKind.FULL, LayerKind.SLIDING, LayerKind.MAMBA, LayerKind.MLP
MAMBA_KEYS = {"mamba_n_heads": 4, "mamba_d_state": 16, "mamba_d_head": 32, "mamba_chunk_size": 16}


def _cfg(layers: int, **extra: Any) -> dict[str, Any]:
    base = {
        "vocab_size": 100,
        "hidden_size": 64,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
    }
    return {**base, "num_hidden_layers": layers, **extra}


def _kinds(raw: dict[str, Any]) -> tuple[LayerKind, ...]:
    return build_model_config("X", raw, ()).layer_kinds


def test_legacy_layers_block_type() -> None:
    raw = _cfg(4, layers_block_type=["mamba", "attention", "mamba", "mamba"], **MAMBA_KEYS)
    assert _kinds(raw) == (M, F, M, M)


def test_layer_types_5x_and_legacy_names() -> None:
    types = ["linear_attention", "full_attention", "mamba", "attention"]
    assert _kinds(_cfg(4, layer_types=types, **MAMBA_KEYS)) == (M, F, M, F)


def test_attn_layer_indices() -> None:
    assert _kinds(_cfg(5, attn_layer_indices=[1, 4], **MAMBA_KEYS)) == (M, F, M, M, F)


def test_hybrid_override_pattern() -> None:
    assert _kinds(_cfg(6, hybrid_override_pattern="M-M*-E", **MAMBA_KEYS)) == (M, N, M, F, N, N)


def test_gemma3_sliding_window_pattern() -> None:
    raw = _cfg(8, model_type="gemma3_text", sliding_window=64, sliding_window_pattern=4)
    assert _kinds(raw) == (S, S, S, F, S, S, S, F)
    assert _kinds({**raw, "sliding_window_pattern": None}) == (S, S, S, S, S, F, S, S)


def test_qwen3_max_window_layers() -> None:
    raw = _cfg(
        4, model_type="qwen3", use_sliding_window=True, sliding_window=32, max_window_layers=2
    )
    assert _kinds(raw) == (F, F, S, S)


def test_qwen3_sliding_disabled_means_full_attention() -> None:
    raw = _cfg(
        2,
        model_type="qwen3",
        use_sliding_window=False,
        sliding_window=32,
        layer_types=["sliding_attention", "full_attention"],
    )
    assert _kinds(raw) == (F, F)


def test_layer_specs_and_layout() -> None:
    raw = _cfg(
        8, model_type="gemma3_text", sliding_window=32, sliding_window_pattern=4, head_dim=16
    )
    cfg = build_model_config("Gemma3ForCausalLM", raw, ())
    specs = cfg.layer_specs(16, "bfloat16")
    assert specs[0] == SlidingWindowSpec(16, 2, 16, "bfloat16", 32)
    assert specs[3] == FullAttentionSpec(16, 2, 16, "bfloat16")
    layout = create_layout(specs)
    assert layout.group_size == 2 and len(layout.groups) == 4


def test_mamba_state_spec_keeps_ssm_in_float32() -> None:
    raw = _cfg(2, layer_types=["mamba", "attention"], mamba_d_conv=4, **MAMBA_KEYS)
    spec = build_model_config("X", raw, ()).layer_specs(16, "bfloat16")[0]
    conv_dim = 128 + 2 * 16
    assert spec == StateSpec("mamba2", ((conv_dim, 3), (4, 32, 16)), ("bfloat16", "float32"))


def test_infinite_time_step_limit_in_transformers_json_encoding() -> None:
    raw = _cfg(
        1, layer_types=["mamba"], time_step_limit=[0.0, {"__float__": "Infinity"}], **MAMBA_KEYS
    )
    mamba = build_model_config("X", raw, ()).mamba
    assert mamba is not None and mamba.dt_max == float("inf")


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (_cfg(2, layer_types=["full_attention"]), "2"),
        (_cfg(1, layer_types=["weird"]), "unsupported layer types"),
        (_cfg(1, hybrid_override_pattern="X"), "unknown symbols"),
        ({**_cfg(1), "vocab_size": "many"}, "'vocab_size' must be an integer"),
    ],
)
def test_bad_configs_name_the_problem(raw: dict[str, Any], message: str) -> None:
    with pytest.raises(ModelLoadError, match=message):
        build_model_config("X", raw, ())


def test_eos_from_generation_config_wins() -> None:
    cfg = build_model_config("X", _cfg(1, eos_token_id=5), (7, 8))
    assert cfg.eos_token_ids == (7, 8)
    assert build_model_config("X", _cfg(1, eos_token_id=5), ()).eos_token_ids == (5,)
