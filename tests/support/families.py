"""Tiny checkpoints of the families added for issue 14, built WITH transformers.

``FAMILIES`` names them; ``make_family_checkpoint(family, out_dir)`` writes one (float32,
fixed seed) with our tiny tokenizer. Each config departs from the defaults on purpose (head
dims, windows, layer patterns, expert counts), with short Mamba chunks so the tests' prompts
cross several of them.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from hybridkv.model.make_model import model_config_json
from hybridkv.model.tiny_tokenizer import write_tokenizer


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


_BUILDERS: dict[str, Callable[[], Any]] = {
    "gemma3_mm": _gemma3_mm,
}
FAMILIES = tuple(_BUILDERS)
STATE_FAMILIES: frozenset[str] = frozenset()


def make_family_checkpoint(family: str, out_dir: Path, seed: int = 0) -> Path:
    from transformers import AutoModelForCausalLM

    config = _BUILDERS[family]()
    torch.manual_seed(seed)
    if family == "gemma3_mm":
        from transformers import Gemma3ForConditionalGeneration

        model = Gemma3ForConditionalGeneration(config)
    else:
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    out_dir = Path(out_dir)
    model.to(torch.float32).save_pretrained(out_dir)
    write_tokenizer(out_dir, 1024)
    eos = model_config_json("qwen3", "tiny")["eos_token_id"]
    (out_dir / "generation_config.json").write_text(json.dumps({"eos_token_id": eos}))
    return out_dir
