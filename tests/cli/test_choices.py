"""The CLI's choices come from the registries, not hand copies."""

from __future__ import annotations

import argparse

import pytest

from hybridkv.cli import build_parser
from hybridkv.model.families.registry import get_families, get_make_model_archs


def _subparser(name: str) -> argparse.ArgumentParser:
    subs = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    parser: argparse.ArgumentParser = subs.choices[name]
    return parser


def test_make_model_arch_choices_are_the_registry() -> None:
    arch = next(a for a in _subparser("make-model")._actions if a.dest == "arch")
    assert arch.choices is not None
    assert tuple(arch.choices) == get_make_model_archs()
    made = [n for f in get_families() for n in f.get_make_configs()]
    assert tuple(arch.choices) == tuple(made)


def test_make_model_refuses_an_unregistered_arch(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["make-model", "--arch", "llama", "--out", "x"])
    assert "invalid choice: 'llama'" in capsys.readouterr().err
    args = build_parser().parse_args(["make-model", "--arch", "qwen3_5", "--out", "x"])
    assert args.arch == "qwen3_5"
