"""Write small random checkpoints in Hugging Face format, with our own code only.

``make_model(arch, out_dir, size, seed)`` writes config.json, model.safetensors,
generation_config.json and the tokenizer files; transformers' ``AutoModelForCausalLM``
loads the result. Parameter names and shapes come from our own model classes (built on the
meta device), values from a seeded generator.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from hybridkv.model.config.model_config import build_model_config
from hybridkv.model.families.parts import FAMILY_CONFIGS
from hybridkv.model.families.registry import get_model_class
from hybridkv.model.loading.tiny_tokenizer import (
    EOS_TOKEN,
    PAD_TOKEN,
    special_token_ids,
    write_tokenizer,
)

# qwen3_full: Qwen3 with full attention on every layer (vLLM's CPU backend refuses checkpoints
# with sliding windows on some layers only; the vLLM baseline runs this one)
ARCHS = ("qwen3", "qwen3_full", "gemma3", "granitemoehybrid", *FAMILY_CONFIGS)
SIZES = ("tiny", "small")
INIT_STD = 0.02


def make_model(arch: str, out_dir: Path, size: str = "tiny", seed: int = 0) -> Path:
    """Build a random checkpoint of ``arch`` (one of ``ARCHS``) in ``out_dir``; returns it."""
    config = model_config_json(arch, size)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer_vocab = write_tokenizer(out_dir, 1024 if size == "tiny" else 2048)
    if tokenizer_vocab > config["vocab_size"]:
        raise AssertionError(
            f"tokenizer has {tokenizer_vocab} tokens, model {config['vocab_size']}"
        )
    (out_dir / "config.json").write_text(json.dumps(config, indent=2))
    eos = config["eos_token_id"]
    generation = {"eos_token_id": eos, "pad_token_id": config["pad_token_id"]}
    (out_dir / "generation_config.json").write_text(json.dumps(generation, indent=2))
    save_file(random_weights(config, seed), str(out_dir / "model.safetensors"), {"format": "pt"})
    return out_dir


def ensure_model(arch: str, target: Path, size: str = "tiny", seed: int = 0) -> bool:
    """Make sure ``target`` holds a ``make_model`` checkpoint; returns True if this call built
    it. Built in a temporary sibling directory and renamed, so a reader (or a racing builder)
    never sees half a checkpoint."""
    target = Path(target)
    if (target / "model.safetensors").exists():
        return False
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".building-", dir=target.parent))
    try:
        make_model(arch, tmp, size=size, seed=seed)
        try:
            tmp.rename(target)
        except OSError:  # another process won the race
            if not (target / "model.safetensors").exists():
                raise
            return False
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return True


def model_config_json(arch: str, size: str) -> dict[str, Any]:
    if arch not in ARCHS:
        raise ValueError(f"unknown architecture {arch!r}; choose one of {', '.join(ARCHS)}")
    if size not in SIZES:
        raise ValueError(f"unknown model size {size!r}; choose one of {', '.join(SIZES)}")
    ids = special_token_ids()
    common = {
        "vocab_size": 1024 if size == "tiny" else 2048,
        "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-6,
        "initializer_range": INIT_STD,
        "eos_token_id": [ids[EOS_TOKEN], ids[PAD_TOKEN]],
        "pad_token_id": ids[PAD_TOKEN],
        "bos_token_id": None,
        "torch_dtype": "float32",
    }
    return {**common, **_ARCH_CONFIGS[arch](size == "tiny")}


def _qwen3(tiny: bool) -> dict[str, Any]:
    layers = 4 if tiny else 12
    return {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "hidden_size": 64 if tiny else 768,
        "intermediate_size": 128 if tiny else 2048,
        "num_hidden_layers": layers,
        "num_attention_heads": 4 if tiny else 12,
        "num_key_value_heads": 2 if tiny else 4,
        "head_dim": 16 if tiny else 64,
        "hidden_act": "silu",
        "rope_theta": 10000.0,
        "use_sliding_window": True,
        "sliding_window": 32 if tiny else 512,
        "max_window_layers": layers // 2,
        "layer_types": [
            "full_attention" if i % 2 == 0 else "sliding_attention" for i in range(layers)
        ],
        "tie_word_embeddings": False,
    }


def _qwen3_full(tiny: bool) -> dict[str, Any]:
    config = _qwen3(tiny)
    layers = config["num_hidden_layers"]
    config.update(
        use_sliding_window=False,
        sliding_window=None,
        max_window_layers=layers,
        layer_types=["full_attention"] * layers,
    )
    return config


def _gemma3(tiny: bool) -> dict[str, Any]:
    return {
        "architectures": ["Gemma3ForCausalLM"],
        "model_type": "gemma3_text",
        "hidden_size": 64 if tiny else 768,
        "intermediate_size": 128 if tiny else 2048,
        "num_hidden_layers": 6 if tiny else 12,
        "num_attention_heads": 4 if tiny else 12,
        "num_key_value_heads": 2 if tiny else 4,
        "head_dim": 16 if tiny else 64,
        "query_pre_attn_scalar": 16 if tiny else 64,
        "hidden_activation": "gelu_pytorch_tanh",
        "sliding_window": 32 if tiny else 512,
        "sliding_window_pattern": 6,
        "rope_theta": 1_000_000.0,
        "rope_local_base_freq": 10_000.0,
        "final_logit_softcapping": 30.0,
        "attn_logit_softcapping": None,
        "tie_word_embeddings": True,
    }


def _granite(tiny: bool) -> dict[str, Any]:
    layers = 4 if tiny else 12
    hidden = 64 if tiny else 768
    return {
        "architectures": ["GraniteMoeHybridForCausalLM"],
        "model_type": "granitemoehybrid",
        "hidden_size": hidden,
        "intermediate_size": 64 if tiny else 1024,
        "shared_intermediate_size": 128 if tiny else 2048,
        "num_hidden_layers": layers,
        "num_attention_heads": 4 if tiny else 12,
        "num_key_value_heads": 2 if tiny else 4,
        "hidden_act": "silu",
        "layer_types": ["attention" if i % 4 == 3 else "mamba" for i in range(layers)],
        "mamba_n_heads": 4 if tiny else 24,
        "mamba_d_head": 2 * hidden // (4 if tiny else 24),
        "mamba_d_state": 16 if tiny else 64,
        "mamba_n_groups": 1,
        "mamba_d_conv": 4,
        "mamba_expand": 2,
        "mamba_chunk_size": 16 if tiny else 64,
        "mamba_conv_bias": True,
        "mamba_proj_bias": False,
        "num_local_experts": 0,
        "num_experts_per_tok": 0,
        "position_embedding_type": "rope",
        "rope_theta": 10000.0,
        "embedding_multiplier": 12.0,
        "attention_multiplier": 1.0 / (16 if tiny else 64),
        "residual_multiplier": 0.22,
        "logits_scaling": 2.0,
        "tie_word_embeddings": False,
    }


_ARCH_CONFIGS = {
    "qwen3": _qwen3,
    "qwen3_full": _qwen3_full,
    "gemma3": _gemma3,
    "granitemoehybrid": _granite,
    **FAMILY_CONFIGS,
}
# (1 + w) norms stored around 0 (Gemma, Qwen3-Next / 3.5; not their DeltaNet output norm)
_OFFSET_NORM_ARCHS = {"Gemma3ForCausalLM", "Qwen3NextForCausalLM", "Qwen3_5ForCausalLM"}


def random_weights(config: dict[str, Any], seed: int) -> dict[str, torch.Tensor]:
    """Every parameter of our model class for ``config``, drawn from a seeded generator."""
    arch = config["architectures"][0]
    cfg = build_model_config(arch, config, ())
    with torch.device("meta"):
        shapes = {name: tuple(p.shape) for name, p in get_model_class(arch)(cfg).named_parameters()}
    if cfg.tie_word_embeddings:
        shapes.pop("lm_head.weight", None)
    gen = torch.Generator().manual_seed(seed)
    offset = arch in _OFFSET_NORM_ARCHS
    weights = {
        name: _init(name, shape, gen, offset and "linear_attn.norm" not in name)
        for name, shape in sorted(shapes.items())
    }
    return _checkpoint_layout(arch, weights)


def _checkpoint_layout(arch: str, weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The names transformers' ``save_pretrained`` writes (what it loads back): Nemotron-H
    under ``backbone.``, and stacked Nemotron-H / Qwen3-Next experts one tensor per expert."""
    if arch not in ("NemotronHForCausalLM", "Qwen3NextForCausalLM"):
        return weights
    out: dict[str, torch.Tensor] = {}
    for name, tensor in weights.items():
        if arch == "NemotronHForCausalLM" and name.startswith("model."):
            name = "backbone." + name.removeprefix("model.")
        head, sep, leaf = name.rpartition(".experts.")
        if sep and "." not in leaf:
            out.update({f"{head}.experts.{e}.{leaf}.weight": w for e, w in enumerate(tensor)})
        else:
            out[name] = tensor
    return out


def _init(
    name: str, shape: tuple[int, ...], gen: torch.Generator, offset_norm: bool
) -> torch.Tensor:
    parts = name.split(".")
    leaf, parent = parts[-1], (parts[-2] if len(parts) > 1 else "")
    if leaf == "A_log":
        return torch.log(torch.arange(1, shape[0] + 1, dtype=torch.float32))
    if leaf in ("D", "dt_bias"):
        return torch.ones(shape)
    if leaf == "bias":
        return torch.zeros(shape)
    if "norm" in parent:  # (1 + w) norms are stored around 0, plain ones around 1
        noise = torch.randn(shape, generator=gen) * 0.1
        return noise if offset_norm else 1.0 + noise
    std = 0.2 if parent == "conv1d" else INIT_STD
    return torch.randn(shape, generator=gen) * std
