"""make_model checkpoints: transformers loads them and agrees with our runner."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer as TokenizersTokenizer

from hybridkv.model.config.model_config import LayerKind, build_model_config
from hybridkv.model.families.registry import get_make_model_archs
from hybridkv.model.loading.loader import get_model_class
from hybridkv.model.loading.make_model import make_model, model_config_json, reserve_tokens
from hybridkv.model.loading.tiny_tokenizer import write_tokenizer
from hybridkv.model.loading.tokenizer import Tokenizer
from tests.model.conftest import make_runner
from tests.support.checkpoints import hf_greedy, hf_logits
from tests.support.driver import RunnerDriver


@pytest.mark.parametrize("arch", get_make_model_archs())
def test_make_model_matches_transformers(arch: str, tmp_path: Path) -> None:
    model_dir = make_model(arch, tmp_path / arch, seed=3)
    tok = Tokenizer(model_dir)
    prompt = tok.encode(
        "The quick brown fox jumps over the lazy dog, then the cache block is full."
    )
    prompt = prompt * 3  # longer than the sliding window and the mamba chunk
    driver = RunnerDriver(make_runner(model_dir))
    driver.add("r", prompt)
    driver.step({"r": 23})
    driver.step({"r": len(prompt) - 23})
    driver.decode_all(["r"], 7)
    req = driver.requests["r"]
    ref_tokens, _ = hf_greedy(model_dir, prompt, len(req.output))
    assert req.output == ref_tokens
    ref = hf_logits(model_dir, req.tokens[: req.computed])
    assert (driver.all_logits("r") - ref).abs().max().item() < 1e-4
    assert len(set(req.output)) > 1 or req.output[0] not in (0, 1, 2)  # not degenerate


def test_make_model_is_deterministic(tmp_path: Path) -> None:
    a = make_model("qwen3", tmp_path / "a", seed=1)
    b = make_model("qwen3", tmp_path / "b", seed=1)
    assert (a / "model.safetensors").read_bytes() == (b / "model.safetensors").read_bytes()
    assert (a / "tokenizer.json").read_bytes() == (b / "tokenizer.json").read_bytes()


@pytest.mark.parametrize("arch", get_make_model_archs())
def test_tiny_layer_patterns(arch: str) -> None:
    raw = model_config_json(arch, "tiny")
    kinds = build_model_config(raw["architectures"][0], raw, ()).layer_kinds
    if arch == "qwen3":
        assert LayerKind.SLIDING in kinds and LayerKind.FULL in kinds
    if arch == "qwen3_full":  # what vLLM's CPU backend can run
        assert set(kinds) == {LayerKind.FULL}
    if arch == "gemma3":
        assert len(kinds) >= 6 and kinds[:6] == (LayerKind.SLIDING,) * 5 + (LayerKind.FULL,)
    if arch == "granitemoehybrid":
        assert kinds.count(LayerKind.MAMBA) == 3 * kinds.count(LayerKind.FULL)


@pytest.mark.parametrize("arch", get_make_model_archs())
def test_small_size_has_50_to_150m_params(arch: str) -> None:
    raw = model_config_json(arch, "small")
    cfg = build_model_config(raw["architectures"][0], raw, ())
    with torch.device("meta"):
        model = get_model_class(cfg.architecture)(cfg)
    params = sum(p.numel() for p in model.parameters())
    assert 50e6 <= params <= 150e6, params


def test_unknown_arch_and_size(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown architecture 'llama'"):
        make_model("llama", tmp_path)
    with pytest.raises(ValueError, match="unknown model size 'huge'"):
        make_model("qwen3", tmp_path, size="huge")


def test_tokenizer_covers_the_vocabulary(tmp_path: Path) -> None:
    """The small tokenizer trains fewer tokens than the model's 2048 rows: reserved tokens fill
    the rest (llama.cpp's Gemma converter trims the embedding to the tokenizer), and
    encoding is unchanged (no merge makes them)."""
    trained = write_tokenizer(tmp_path, 2048)
    before = Tokenizer(tmp_path).encode("The cache block of the model, 42 tokens!")
    assert trained < 2048
    reserve_tokens(tmp_path / "tokenizer.json", 2048)
    tok = TokenizersTokenizer.from_file(str(tmp_path / "tokenizer.json"))
    assert tok.get_vocab_size() == 2048 and tok.id_to_token(2047) == "<|reserved_2047|>"
    assert Tokenizer(tmp_path).encode("The cache block of the model, 42 tokens!") == before
