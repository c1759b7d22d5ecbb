"""The registry of model families: one ``ModelFamily`` descriptor per family, each module
imported on first use. The loader resolves ``config.json``'s architecture here, ``make-model``
its configs, the CLI its ``--arch`` choices (no torch is imported: keep descriptors so).

Adding a family: its model file under ``models/``, its descriptor module under ``families/``
(``FAMILY = ModelFamily(...)``), and its module name in ``_FAMILY_MODULES`` below.
"""

from __future__ import annotations

import functools
import importlib

from hybridkv.model.config.errors import ModelLoadError
from hybridkv.model.families.family import ConfigBuilder, ModelFamily

# descriptor modules under hybridkv.model.families, in the order --arch lists them
_FAMILY_MODULES = (
    "qwen3",
    "gemma3",
    "granitemoehybrid",
    "bamba",
    "nemotron_h",
    "falcon_h1",
    "qwen3_next",
    "qwen3_5",
    "gpt_oss",
)


@functools.cache
def get_families() -> tuple[ModelFamily, ...]:
    """Every registered family (descriptor modules imported on the first call)."""
    families = tuple(
        importlib.import_module(f"hybridkv.model.families.{name}").FAMILY
        for name in _FAMILY_MODULES
    )
    _check_unique([f.name for f in families], "family")
    _check_unique([a for f in families for a in f.architectures], "architecture")
    _check_unique([n for f in families for n in f.get_make_configs()], "make-model name")
    return families


def get_family(name: str) -> ModelFamily:
    for family in get_families():
        if family.name == name:
            return family
    raise ValueError(f"unknown model family {name!r}; choose one of {_names()}")


@functools.cache
def _by_architecture() -> dict[str, ModelFamily]:
    return {arch: f for f in get_families() for arch in f.architectures}


def get_family_of(architecture: str) -> ModelFamily:
    """The family of a supported architecture (``check_architecture`` first)."""
    return _by_architecture()[architecture]


def supported_architectures() -> tuple[str, ...]:
    return tuple(sorted(_by_architecture()))


def check_architecture(architectures: object) -> str:
    """The first supported name in config.json's ``architectures`` list."""
    if not isinstance(architectures, list) or not architectures:
        raise ModelLoadError(
            "config.json has no 'architectures' list; supported: "
            + ", ".join(supported_architectures())
        )
    for name in architectures:
        if name in _by_architecture():
            return str(name)
    raise ModelLoadError(
        f"unsupported architecture {architectures!r}; supported: "
        + ", ".join(supported_architectures())
    )


@functools.cache
def _make_configs() -> dict[str, tuple[ModelFamily, ConfigBuilder]]:
    return {n: (f, b) for f in get_families() for n, b in f.get_make_configs().items()}


def get_make_model_archs() -> tuple[str, ...]:
    """make-model's ``--arch`` choices: every family's checkpoint and variants."""
    return tuple(_make_configs())


def get_make_config(arch: str) -> tuple[ModelFamily, ConfigBuilder]:
    """The family and config builder of make-model's ``arch``."""
    try:
        return _make_configs()[arch]
    except KeyError:
        choices = ", ".join(get_make_model_archs())
        raise ValueError(f"unknown architecture {arch!r}; choose one of {choices}") from None


def _names() -> str:
    return ", ".join(f.name for f in get_families())


def _check_unique(names: list[str], what: str) -> None:
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise ValueError(f"{what} {name!r} is registered twice")
        seen.add(name)
