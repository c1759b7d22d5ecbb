"""Checkpoint loading: sharded index, tied embeddings, and every ModelLoadError case."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from hybridkv.model.config.errors import ModelLoadError
from hybridkv.model.loading.loader import load_model
from tests.model.conftest import make_runner
from tests.support.driver import RunnerDriver


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def _greedy_logits(model_dir: Path) -> torch.Tensor:
    driver = RunnerDriver(make_runner(model_dir))
    driver.add("r", list(range(3, 40)))
    driver.step({"r": 37})
    return driver.all_logits("r")


def test_sharded_index_loads_the_same_weights(
    hf_checkpoints: dict[str, Path], tmp_path: Path
) -> None:
    src = hf_checkpoints["qwen3"]
    dst = _copy(src, tmp_path / "sharded")
    tensors = load_file(str(dst / "model.safetensors"))
    (dst / "model.safetensors").unlink()
    names = sorted(tensors)
    shards = {
        "model-00001-of-00002.safetensors": names[::2],
        "model-00002-of-00002.safetensors": names[1::2],
    }
    weight_map = {}
    for file, part in shards.items():
        save_file({n: tensors[n] for n in part}, str(dst / file))
        weight_map.update(dict.fromkeys(part, file))
    (dst / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    assert torch.equal(_greedy_logits(dst), _greedy_logits(src))


def test_tied_embeddings_share_one_tensor(hf_checkpoints: dict[str, Path]) -> None:
    model_dir = hf_checkpoints["gemma3"]
    assert "lm_head.weight" not in load_file(str(model_dir / "model.safetensors"))
    model, cfg = load_model(model_dir)
    assert cfg.tie_word_embeddings
    assert model.lm_head.weight is model.model.embed_tokens.weight


def test_missing_directory(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="does not exist"):
        load_model(tmp_path / "nope")


def test_missing_config(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="no config.json"):
        load_model(tmp_path)


def test_unsupported_architecture_lists_supported(
    hf_checkpoints: dict[str, Path], tmp_path: Path
) -> None:
    dst = _copy(hf_checkpoints["qwen3"], tmp_path / "m")
    config = json.loads((dst / "config.json").read_text())
    config["architectures"] = ["LlamaForCausalLM"]
    (dst / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelLoadError, match="LlamaForCausalLM.*supported: .*Qwen3ForCausalLM"):
        load_model(dst)


def test_missing_weights_file(hf_checkpoints: dict[str, Path], tmp_path: Path) -> None:
    dst = _copy(hf_checkpoints["qwen3"], tmp_path / "m")
    (dst / "model.safetensors").unlink()
    with pytest.raises(ModelLoadError, match="no model.safetensors"):
        load_model(dst)


def test_missing_tensor_is_named(hf_checkpoints: dict[str, Path], tmp_path: Path) -> None:
    dst = _copy(hf_checkpoints["granitemoehybrid"], tmp_path / "m")
    tensors = load_file(str(dst / "model.safetensors"))
    del tensors["model.layers.1.mamba.A_log"]
    save_file(tensors, str(dst / "model.safetensors"))
    with pytest.raises(ModelLoadError, match=r"'model\.layers\.1\.mamba\.A_log' is missing"):
        load_model(dst)


def test_misshaped_tensor_names_both_shapes(
    hf_checkpoints: dict[str, Path], tmp_path: Path
) -> None:
    dst = _copy(hf_checkpoints["qwen3"], tmp_path / "m")
    tensors = load_file(str(dst / "model.safetensors"))
    tensors["model.layers.0.self_attn.k_proj.weight"] = torch.zeros(16, 64)
    save_file(tensors, str(dst / "model.safetensors"))
    with pytest.raises(
        ModelLoadError, match=r"k_proj\.weight' has shape \(16, 64\), expected \(32, 64\)"
    ):
        load_model(dst)


def test_missing_shard_file(hf_checkpoints: dict[str, Path], tmp_path: Path) -> None:
    dst = _copy(hf_checkpoints["qwen3"], tmp_path / "m")
    (dst / "model.safetensors").unlink()
    index = {"weight_map": {"lm_head.weight": "model-00001-of-00001.safetensors"}}
    (dst / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(ModelLoadError, match="shard files that do not exist"):
        load_model(dst)


def test_unknown_dtype(hf_checkpoints: dict[str, Path]) -> None:
    with pytest.raises(ValueError, match="unsupported model dtype 'float8'"):
        load_model(hf_checkpoints["qwen3"], "float8")
