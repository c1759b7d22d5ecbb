"""Tiny random checkpoints built WITH transformers, and transformers reference outputs.

``make_hf_checkpoint(arch, out_dir, **overrides)`` -> a checkpoint dir written by
``save_pretrained`` (float32, fixed seed) plus our tiny tokenizer. Archs: ``qwen3`` (sliding
layers, window 32), ``gemma3`` (6 layers, 5:1, window 32, final softcap), ``granitemoehybrid``
(3 mamba : 1 attention, mamba chunk 16, RoPE) and ``granitemoehybrid_moe`` (4 experts top-2,
no RoPE as in Granite 4.0-H).
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import torch

from hybridkv.model.loading.make_model import model_config_json
from hybridkv.model.loading.tiny_tokenizer import write_tokenizer

HF_ARCHS = ("qwen3", "gemma3", "granitemoehybrid", "granitemoehybrid_moe")
HF_FAMILIES = frozenset(arch.removesuffix("_moe") for arch in HF_ARCHS)  # registry names

_MOE = {
    "num_local_experts": 4,
    "num_experts_per_tok": 2,
    "position_embedding_type": "nope",
    "layer_types": ["mamba", "attention", "mamba", "mamba"],
}


def hf_config_dict(arch: str, **overrides: Any) -> dict[str, Any]:
    if arch not in HF_ARCHS:
        raise ValueError(f"unknown test architecture {arch!r}; choose one of {HF_ARCHS}")
    base = model_config_json(arch.removesuffix("_moe"), "tiny")
    if arch.endswith("_moe"):
        base.update(_MOE)
    base["initializer_range"] = 0.05  # peakier logits than 0.02: fewer near-ties in greedy tests
    base.update(overrides)
    return base


def make_hf_checkpoint(arch: str, out_dir: Path, seed: int = 0, **config_overrides: Any) -> Path:
    from transformers import AutoConfig, AutoModelForCausalLM

    raw = hf_config_dict(arch, **config_overrides)
    raw.pop("architectures")
    config = AutoConfig.for_model(raw.pop("model_type"), **raw)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    out_dir = Path(out_dir)
    model.save_pretrained(out_dir)
    write_tokenizer(out_dir, 1024)
    eos = raw["eos_token_id"]
    (out_dir / "generation_config.json").write_text(json.dumps({"eos_token_id": eos}))
    return out_dir


class SharedCheckpoints:
    """The session's checkpoints, each built once under ``root`` whichever test folder asks:
    ``get(arch, seed=0, name=None, **overrides)`` -> its directory (``name`` only names the
    directory; the same arch, seed and overrides give the same one). Read-only: a test that
    edits a checkpoint copies it first (``tests/engine/helpers.copy_checkpoint``)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.built: dict[str, Path] = {}

    def get(self, arch: str, seed: int = 0, name: str | None = None, **overrides: Any) -> Path:
        key = json.dumps([arch, seed, overrides], sort_keys=True)
        if key not in self.built:
            default = arch if seed == 0 and not overrides else f"{arch}-{len(self.built)}"
            folder = self.root / (name or default)
            if folder.exists():  # the name was taken by another arch, seed or overrides
                folder = self.root / f"{folder.name}-{len(self.built)}"
            self.built[key] = make_hf_checkpoint(arch, folder, seed=seed, **overrides)
        return self.built[key]


@functools.lru_cache(maxsize=8)
def hf_model(model_dir: Path) -> Any:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    return model.eval()


@torch.inference_mode()
def hf_logits(model_dir: Path, ids: list[int]) -> torch.Tensor:
    """float32 logits ``[len(ids), vocab]`` of one full forward pass."""
    return hf_model(Path(model_dir))(torch.tensor([ids])).logits[0].float()


@torch.inference_mode()
def hf_greedy(
    model_dir: Path, prompt_ids: list[int], max_new_tokens: int
) -> tuple[list[int], list[torch.Tensor]]:
    """transformers ``generate`` (greedy, float32): new token ids and each step's logits."""
    model = hf_model(Path(model_dir))
    out = model.generate(
        torch.tensor([prompt_ids]),
        max_new_tokens=max_new_tokens,
        min_new_tokens=max_new_tokens,
        do_sample=False,
        output_logits=True,
        return_dict_in_generate=True,
        pad_token_id=0,
    )
    new = out.sequences[0, len(prompt_ids) :].tolist()
    return new, [step[0].float() for step in out.logits]
