"""Tiny checkpoints of the families added for issue 14, built WITH transformers.

``FAMILIES`` names them; ``make_family_checkpoint(family, out_dir)`` writes one (float32,
fixed seed) with our tiny tokenizer. ``CORE_FAMILIES`` are the registry's families that
``tests/support/checkpoints.py`` does not build: a newly registered family lands there, and
its parity tests fail until ``_BUILDERS`` has its checkpoint. Each config departs from the defaults on purpose (head
dims, windows, layer patterns, expert counts), with short Mamba chunks so the tests' prompts
cross several of them.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from hybridkv.model.config.layer_kinds import LayerKind
from hybridkv.model.families.registry import get_families
from hybridkv.model.loading.make_model import model_config_json
from hybridkv.model.loading.tiny_tokenizer import write_tokenizer
from tests.support.checkpoints import HF_FAMILIES


def _gemma3_mm() -> Any:
    from transformers import Gemma3Config

    text = model_config_json("gemma3", "tiny")
    text.pop("architectures")
    text["initializer_range"] = 0.05
    vision = {
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "image_size": 28,
        "patch_size": 14,
    }
    return Gemma3Config(
        text_config=text,
        vision_config=vision,
        mm_tokens_per_image=4,
        image_token_index=1000,
        boi_token_index=998,
        eoi_token_index=999,
        eos_token_id=text["eos_token_id"],
        initializer_range=0.05,
    )


_COMMON: dict[str, Any] = {
    "vocab_size": 1024,
    "hidden_size": 64,
    "max_position_embeddings": 4096,
    "initializer_range": 0.05,  # peaky logits: few near-ties in greedy tests
    "eos_token_id": [2, 0],
    "pad_token_id": 0,
    "bos_token_id": None,
    "tie_word_embeddings": False,
}


def _auto(model_type: str, **config: Any) -> Callable[[], Any]:
    def build() -> Any:
        from transformers import AutoConfig

        return AutoConfig.for_model(model_type, **{**_COMMON, **config})

    return build


_MAMBA_SMALL = {"mamba_d_state": 8, "mamba_n_groups": 2, "mamba_chunk_size": 16}

_QWEN_GDN: dict[str, Any] = {
    "intermediate_size": 96,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 24,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "linear_key_head_dim": 16,
    "linear_value_head_dim": 12,
}


def _qwen3_5_mm() -> Any:
    from transformers import Qwen3_5Config

    vision = {
        "depth": 1,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_heads": 2,
        "out_hidden_size": 64,
        "patch_size": 14,
        "num_position_embeddings": 16,
    }
    text = {**_COMMON, **_QWEN_GDN}
    return Qwen3_5Config(text_config=text, vision_config=vision, image_token_id=1000)


_BUILDERS: dict[str, Callable[[], Any]] = {
    "gemma3_mm": _gemma3_mm,
    # 4 layers, attention at 1, 8 mamba heads of 16, partial RoPE (0.5)
    "bamba": _auto(
        "bamba",
        intermediate_size=96,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        attn_layer_indices=[1],
        mamba_n_heads=8,
        mamba_d_head=16,
        **_MAMBA_SMALL,
    ),
    # M E * M - M: mamba, MoE (6 experts in 2 groups, top-2, shared expert), attention with
    # head_dim 24 and no RoPE, MLP (relu2)
    "nemotron_h": _auto(
        "nemotron_h",
        hybrid_override_pattern="ME*M-M",
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=24,
        intermediate_size=96,
        mamba_num_heads=8,
        mamba_head_dim=12,
        ssm_state_size=8,
        n_groups=2,
        chunk_size=16,
        n_routed_experts=6,
        moe_intermediate_size=32,
        moe_shared_expert_intermediate_size=48,
        num_experts_per_tok=2,
        n_group=2,
        topk_group=1,
        routed_scaling_factor=1.5,
    ),
    # 3 layers of mamba (d_ssm 96 = 6 heads of 16) beside attention, every MuP multiplier set,
    # the output norm applied before the gate
    "falcon_h1": _auto(
        "falcon_h1",
        intermediate_size=96,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        mamba_d_ssm=96,
        mamba_n_heads=6,
        mamba_d_head=16,
        mamba_rms_norm=True,
        mamba_norm_before_gate=True,
        embedding_multiplier=2.0,
        lm_head_multiplier=0.5,
        mlp_multipliers=[1.2, 0.8],
        key_multiplier=0.7,
        attention_in_multiplier=0.9,
        attention_out_multiplier=1.1,
        ssm_multipliers=[1.1, 0.9, 1.2, 0.8, 1.3],
        ssm_in_multiplier=1.05,
        ssm_out_multiplier=0.95,
        **_MAMBA_SMALL,
    ),
    # GDN 3:1 gated attention (head_dim 24, RoPE on a quarter), 2 key / 4 value heads of 16 /
    # 12 dims; MoE (6 experts, top-2, shared expert) on every 2nd layer, dense on the others
    "qwen3_next": _auto(
        "qwen3_next",
        **_QWEN_GDN,
        num_experts=6,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
        shared_expert_intermediate_size=48,
        decoder_sparse_step=2,
    ),
    "qwen3_5": _auto("qwen3_5_text", **_QWEN_GDN),  # dense, separate projections
    "qwen3_5_mm": _qwen3_5_mm,
    # sliding (window 24) / full alternating, head_dim 24, sinks, YaRN, 5 experts top-2
    "gpt_oss": _auto(
        "gpt_oss",
        intermediate_size=48,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=24,
        num_local_experts=5,
        num_experts_per_tok=2,
        sliding_window=24,
    ),
    "qwen3_5_moe": _auto(  # MoE on every layer (5 experts, top-2, not renormalised)
        "qwen3_5_moe_text",
        **_QWEN_GDN,
        num_experts=5,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
        shared_expert_intermediate_size=48,
        norm_topk_prob=False,
    ),
}
# families saved through a multimodal class (the others through AutoModelForCausalLM)
_MULTIMODAL = {
    "gemma3_mm": "Gemma3ForConditionalGeneration",
    "qwen3_5_mm": "Qwen3_5ForConditionalGeneration",
}
FAMILIES = tuple(_BUILDERS)
# one family per distinct model code path: these also run staggered and prefix-hit tests (the
# multimodal wrappers and Qwen3.5-MoE reuse a covered path and run the batch test only)
CORE_FAMILIES = tuple(f.name for f in get_families() if f.name not in HF_FAMILIES)
# those with state layers (Mamba2, Gated DeltaNet)
STATE_FAMILIES = tuple(
    f.name
    for f in get_families()
    if f.name in CORE_FAMILIES and f.layer_kinds & {LayerKind.MAMBA, LayerKind.GDN}
)


def make_family_checkpoint(family: str, out_dir: Path, seed: int = 0) -> Path:
    from transformers import AutoModelForCausalLM

    config = _BUILDERS[family]()
    torch.manual_seed(seed)
    if family in _MULTIMODAL:
        import transformers

        model = getattr(transformers, _MULTIMODAL[family])(config)
    else:
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    out_dir = Path(out_dir)
    model.to(torch.float32).save_pretrained(out_dir)
    write_tokenizer(out_dir, 1024)
    eos = model_config_json("qwen3", "tiny")["eos_token_id"]
    (out_dir / "generation_config.json").write_text(json.dumps({"eos_token_id": eos}))
    return out_dir


class FamilyCheckpoints:
    """``checkpoints[family]``: built on first use under ``root``, then reused."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.built: dict[str, Path] = {}

    def __getitem__(self, family: str) -> Path:
        if family not in self.built:
            self.built[family] = make_family_checkpoint(family, self.root / family)
        return self.built[family]
