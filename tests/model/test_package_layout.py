"""The model package's layout: folders in layers, no import circle between its files (imports
under ``TYPE_CHECKING`` and inside functions count), ~20 files at most per folder, and each
folder says what lives in it."""

from __future__ import annotations

import ast
from pathlib import Path

import hybridkv
from tests.test_import_graph import _imports, _module_name, find_cycle

ROOT = Path(hybridkv.__file__).parent
MODEL = ROOT / "model"
# model's folders, lowest first: each imports only folders before it
FOLDERS = ("config", "families", "layers", "models", "loading", "sampling", "compiled", "step")


def file_graph(package: Path, root: Path = ROOT) -> dict[str, set[str]]:
    """Module -> the modules of ``package`` (any depth) it imports; ``from pkg import mod``
    counts as importing ``pkg.mod``, a package's ``__init__`` is not a node."""
    modules = {_module_name(p, root): p for p in package.rglob("*.py") if p.name != "__init__.py"}
    graph: dict[str, set[str]] = {}
    for module, path in modules.items():
        targets = set()
        for target in _imports(path, module) | _from_imports(path):
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target and target != module:
                targets.add(target)
        graph[module] = targets
    return graph


def _from_imports(path: Path) -> set[str]:
    """``from hybridkv.x import name``: ``hybridkv.x.name`` too (``name`` may be a module)."""
    return {
        f"{node.module}.{alias.name}"
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.ImportFrom) and node.module and not node.level
        for alias in node.names
    }


def _folder(module: str) -> str:
    return module.split(".")[2]


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    """Imports from a model folder into a later one in ``FOLDERS``."""
    return sorted(
        f"{src} -> {dst}"
        for src, targets in graph.items()
        for dst in targets
        if FOLDERS.index(_folder(dst)) > FOLDERS.index(_folder(src))
    )


def test_no_import_circle_between_model_files() -> None:
    graph = file_graph(MODEL)
    assert "hybridkv.model.step.step_builder" in graph
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph) or [])


def test_model_folders_import_only_lower_folders() -> None:
    graph = file_graph(MODEL)
    assert {_folder(m) for m in graph} == set(FOLDERS)
    assert upward_imports(graph) == []


def test_every_model_folder_is_small_and_says_what_it_holds() -> None:
    for folder in [MODEL, *(MODEL / name for name in FOLDERS)]:
        files = list(folder.glob("*.py"))
        assert len(files) <= 20, f"{folder.name}/ holds {len(files)} files"
        init = folder / "__init__.py"
        doc = ast.get_docstring(ast.parse(init.read_text()))
        assert doc and len(doc) > 80, f"{init} needs a docstring saying what lives there"


def test_the_checks_catch_a_circle_and_an_upward_import(tmp_path: Path) -> None:
    pkg = tmp_path / "hybridkv" / "model"
    for name, text in {
        "config/a.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
        "    from hybridkv.model.config import b\n",
        "config/b.py": "def f():\n    from hybridkv.model.step.c import X\n",
        "step/c.py": "from hybridkv.model.config.a import Y\n",
    }.items():
        (pkg / name).parent.mkdir(parents=True, exist_ok=True)
        (pkg / name).write_text(text)
    graph = file_graph(pkg, tmp_path / "hybridkv")
    assert graph["hybridkv.model.config.b"] == {"hybridkv.model.step.c"}
    assert find_cycle(graph) is not None
    assert upward_imports(graph) == ["hybridkv.model.config.b -> hybridkv.model.step.c"]
