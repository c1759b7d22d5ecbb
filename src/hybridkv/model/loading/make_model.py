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
from hybridkv.model.families.family import ModelFamily
from hybridkv.model.families.registry import get_family_of, get_make_config
from hybridkv.model.loading.loader import get_model_class
from hybridkv.model.loading.skeleton import skeleton
from hybridkv.model.loading.tiny_tokenizer import (
    EOS_TOKEN,
    PAD_TOKEN,
    special_token_ids,
    write_tokenizer,
)

SIZES = ("tiny", "small")
INIT_STD = 0.02


def make_model(arch: str, out_dir: Path, size: str = "tiny", seed: int = 0) -> Path:
    """Build a random checkpoint of ``arch`` (one of the registry's ``get_make_model_archs()``)
    in ``out_dir``; returns it."""
    config = model_config_json(arch, size)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer_vocab = write_tokenizer(out_dir, 1024 if size == "tiny" else 2048)
    if tokenizer_vocab > config["vocab_size"]:
        raise AssertionError(
            f"tokenizer has {tokenizer_vocab} tokens, model {config['vocab_size']}"
        )
    reserve_tokens(out_dir / "tokenizer.json", config["vocab_size"])
    (out_dir / "config.json").write_text(json.dumps(config, indent=2))
    eos = config["eos_token_id"]
    generation = {"eos_token_id": eos, "pad_token_id": config["pad_token_id"]}
    (out_dir / "generation_config.json").write_text(json.dumps(generation, indent=2))
    save_file(random_weights(config, seed), str(out_dir / "model.safetensors"), {"format": "pt"})
    return out_dir


def reserve_tokens(path: Path, vocab_size: int) -> None:
    """Give the tokenizer one token per embedding row: ``<|reserved_N|>`` entries (no merge
    makes them) after the trained ones. Every id the model can emit then decodes, and
    llama.cpp's converter, which sizes the vocabulary by the tokenizer (Gemma's trims the
    embedding to it), keeps every row."""
    tok = json.loads(path.read_text())
    vocab: dict[str, int] = tok["model"]["vocab"]
    if max(vocab.values()) + 1 >= vocab_size:
        return
    for i in range(max(vocab.values()) + 1, vocab_size):
        vocab[f"<|reserved_{i}|>"] = i
    path.write_text(json.dumps(tok, ensure_ascii=False))


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
    _, make_config = get_make_config(arch)
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
    return {**common, **make_config(size == "tiny")}


def random_weights(config: dict[str, Any], seed: int) -> dict[str, torch.Tensor]:
    """Every parameter of our model class for ``config``, drawn from a seeded generator."""
    arch = config["architectures"][0]
    cfg = build_model_config(arch, config, ())
    with skeleton():
        shapes = {name: tuple(p.shape) for name, p in get_model_class(arch)(cfg).named_parameters()}
    if cfg.tie_word_embeddings:
        shapes.pop("lm_head.weight", None)
    gen = torch.Generator().manual_seed(seed)
    family = get_family_of(arch)
    weights = {
        name: _init(name, shape, gen, family.offset_norms and "linear_attn.norm" not in name)
        for name, shape in sorted(shapes.items())
    }
    return _checkpoint_layout(family, weights)


def _checkpoint_layout(
    family: ModelFamily, weights: dict[str, torch.Tensor]
) -> dict[str, torch.Tensor]:
    """The names transformers' ``save_pretrained`` writes (what it loads back): the family's
    ``saved_prefix`` instead of ours, stacked experts one tensor per expert if it says so."""
    if family.saved_prefix is None and not family.saved_split_experts:
        return weights
    ours, theirs = family.saved_prefix or ("", "")
    out: dict[str, torch.Tensor] = {}
    for name, tensor in weights.items():
        if ours and name.startswith(ours):
            name = theirs + name.removeprefix(ours)
        head, sep, leaf = name.rpartition(".experts.")
        if family.saved_split_experts and sep and "." not in leaf:
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
