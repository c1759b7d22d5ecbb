"""Models by name from the local Hugging Face cache (offline; nothing is downloaded), and
multimodal checkpoints run as their text model."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from hybridkv import LLM, SamplingParams
from hybridkv.model.config.errors import ModelLoadError
from hybridkv.model.loading.hub import hub_cache_dir, resolve_model_dir
from hybridkv.model.loading.make_model import make_model

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def fake_cache(root: Path, repo_id: str, checkpoint: Path) -> Path:
    """``huggingface_hub``'s layout: refs/main names the snapshot holding the files."""
    repo = root / f"models--{repo_id.replace('/', '--')}"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(COMMIT)
    snapshot = repo / "snapshots" / COMMIT
    shutil.copytree(checkpoint, snapshot)
    return snapshot


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_model("qwen3", tmp_path_factory.mktemp("tiny") / "m")


def test_cache_root_follows_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HOME", "/somewhere/hf")
    assert hub_cache_dir() == Path("/somewhere/hf/hub")
    monkeypatch.setenv("HF_HUB_CACHE", "/elsewhere")
    assert hub_cache_dir() == Path("/elsewhere")


def test_org_name_runs_from_the_local_cache(
    tiny: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    snapshot = fake_cache(tmp_path / "hub", "acme/tiny-qwen3", tiny)
    assert resolve_model_dir("acme/tiny-qwen3") == snapshot
    assert resolve_model_dir(f"acme/tiny-qwen3@{COMMIT}") == snapshot
    params = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
    by_name = LLM("acme/tiny-qwen3", dtype="float32", kv_cache_memory="16MiB")
    by_dir = LLM(str(tiny), dtype="float32", kv_cache_memory="16MiB")
    prompt = [[5, 6, 7, 8, 9]]
    got = by_name.generate(prompt, params, use_tqdm=False)[0].token_ids
    assert got == by_dir.generate(prompt, params, use_tqdm=False)[0].token_ids
    assert len(got) == 4


def test_a_name_not_in_the_cache_names_the_cache_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    with pytest.raises(ModelLoadError, match=r"not found.*never downloads") as err:
        LLM("acme/absent-model", dtype="float32")
    assert str(tmp_path / "hub" / "models--acme--absent-model") in str(err.value)
    with pytest.raises(ModelLoadError, match="does not exist"):
        resolve_model_dir("./no/such/dir")
