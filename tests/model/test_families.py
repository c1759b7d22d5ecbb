"""The model family registry: every descriptor resolves to the class it names, its make-model
configs build that class, it imports no torch, and the parity tests cover every family."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest
import torch

from hybridkv.model.config.errors import ModelLoadError
from hybridkv.model.config.layer_kinds import _GDN_MODEL_TYPES, LayerKind
from hybridkv.model.config.model_config import build_model_config
from hybridkv.model.families.family import ModelFamily
from hybridkv.model.families.registry import (
    check_architecture,
    get_families,
    get_family,
    get_family_of,
    get_make_config,
    get_make_model_archs,
    supported_architectures,
)
from hybridkv.model.loading.loader import get_model_class
from hybridkv.model.loading.make_model import model_config_json
from hybridkv.model.models.common import CausalLM
from tests.support.checkpoints import HF_FAMILIES
from tests.support.families import CORE_FAMILIES

MAKE_CONFIGS = [(f, name) for f in get_families() for name in f.get_make_configs()]


def _id(case: tuple[ModelFamily, str]) -> str:
    return case[1]


@pytest.mark.parametrize("case", MAKE_CONFIGS, ids=map(_id, MAKE_CONFIGS))
def test_every_make_config_builds_the_registered_class(case: tuple[ModelFamily, str]) -> None:
    family, name = case
    raw = model_config_json(name, "tiny")
    arch = raw["architectures"][0]
    assert get_family_of(arch) is family and get_make_config(name)[0] is family
    assert raw["model_type"] in family.model_types
    cfg = build_model_config(arch, raw, ())
    assert set(cfg.layer_kinds) <= family.layer_kinds
    with torch.device("meta"):
        model = get_model_class(arch)(cfg)
    assert type(model).__module__ == family.module
    assert type(model).__name__ == family.architectures[arch]
    assert sum(p.numel() for p in model.parameters()) > 0


@pytest.mark.parametrize("arch", supported_architectures())
def test_every_architecture_resolves(arch: str) -> None:
    family = get_family_of(arch)
    cls = get_model_class(arch)
    module, name = family.get_class_path(arch)
    assert cls is getattr(importlib.import_module(module), name)
    assert issubclass(cls, CausalLM)
    assert check_architecture(["SomethingElse", arch]) == arch


def test_a_descriptor_naming_no_model_class_is_a_clear_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    class WrongPath:
        def get_class_path(self, architecture: str) -> tuple[str, str]:
            return "hybridkv.model.layers.mlp", "activation"  # a function, not a CausalLM

    monkeypatch.setattr("hybridkv.model.loading.loader.get_family_of", lambda arch: WrongPath())
    with pytest.raises(ModelLoadError, match="mlp:activation .*Qwen3ForCausalLM.* not a Causal"):
        get_model_class("Qwen3ForCausalLM")


def test_registry_lists_each_name_once() -> None:
    names = [f.name for f in get_families()]
    assert len(names) == len(set(names))
    assert "qwen3_full" in get_make_model_archs()  # a variant of qwen3, one model file
    assert get_family("qwen3").variants.keys() == {"qwen3_full"}
    archs = [a for f in get_families() for a in f.architectures]
    assert sorted(archs) == list(supported_architectures())


def test_unknown_names_are_clear_errors() -> None:
    with pytest.raises(ModelLoadError, match="unsupported architecture.*LlamaForCausalLM"):
        check_architecture(["LlamaForCausalLM"])
    with pytest.raises(ModelLoadError, match="no 'architectures' list"):
        check_architecture("Qwen3ForCausalLM")
    with pytest.raises(ValueError, match="unknown architecture 'llama'"):
        get_make_config("llama")
    with pytest.raises(ValueError, match="unknown model family 'qwen3_full'"):
        get_family("qwen3_full")


def test_gdn_model_types_are_the_gdn_families() -> None:
    """config parsing reads 'linear_attention' as Gated DeltaNet for exactly these types."""
    gdn = {t for f in get_families() if LayerKind.GDN in f.layer_kinds for t in f.model_types}
    assert gdn == _GDN_MODEL_TYPES


def test_parity_tests_cover_every_family() -> None:
    """Each family has a transformers-built checkpoint: tests/support/checkpoints.py's or
    tests/support/families.py's (whose builders the core families' parity tests use)."""
    from tests.support.families import FAMILIES

    names = {f.name for f in get_families()}
    assert names == HF_FAMILIES | set(CORE_FAMILIES)
    assert set(CORE_FAMILIES) <= set(FAMILIES)


def test_the_registry_imports_no_torch() -> None:
    """``hybridkv --help`` builds make-model's choices from it: it must stay fast."""
    code = (
        "import sys\n"
        "from hybridkv.model.families.registry import get_families, get_make_model_archs\n"
        "assert get_families() and get_make_model_archs()\n"
        "import hybridkv.cli\n"
        "hybridkv.cli.build_parser()\n"
        "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.strip() == "[]"
