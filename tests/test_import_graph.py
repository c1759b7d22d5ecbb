"""The package import graph, read from the sources with ``ast`` (every import counts, also
those under ``TYPE_CHECKING`` or inside functions): no cycle between packages, and the layering
rules below hold. A node is a subpackage (``kv``, ``sched``...) or a top-level module
(``config``, ``step_io``...)."""

from __future__ import annotations

import ast
import functools
from collections import defaultdict
from pathlib import Path

import hybridkv

ROOT = Path(hybridkv.__file__).parent

# node -> nodes it must never import
FORBIDDEN: dict[str, set[str]] = {
    "model": {"sched", "engine", "connectors", "server"},
    "native": {"engine", "model", "connectors", "sched", "server"},
    "engine": {"server", "metrics"},  # the engine publishes EngineStats; the server exports them
}
# node -> the only nodes it may import (leaves of the graph)
ALLOWED_ONLY: dict[str, set[str]] = {
    "kv": set(),
    "paths": set(),
    "choice": set(),
    "sampling": set(),  # a request's parameters, parsed at the boundary: torch-free, a leaf
    "step_io": {"kv", "sampling", "choice"},
    # the scheduler plans over the KV core and the connectors' scheduler halves: no model,
    # engine, native kernels or server
    "sched": {"config", "connectors", "kv", "request", "step_io", "sampling", "choice"},
    # connectors see the KV layout, requests and kernels; never the scheduler, engine or model
    "connectors": {
        "choice",
        "kv",
        "native",
        "paths",
        "request",
        "sampling",
        "secret_file",
        "step_io",
    },
    "secret_file": set(),
}
# connector folders (``connectors/<name>/``) that share only ``connectors``' top-level modules
CONNECTOR_FOLDERS = {"nixl", "offloading", "file", "multi", "fault"}


def _node(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _module_name(path: Path, root: Path) -> str:
    rel = path.relative_to(root.parent).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


@functools.cache  # each source is parsed once per session, not once per rule
def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), str(path))


@functools.cache
def _imports(path: Path, module: str) -> frozenset[str]:
    found: set[str] = set()
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(_tree(path)):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against this module's package
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                found.add(f"{base}.{node.module}" if node.module else base)
            elif node.module:
                found.add(node.module)
    return frozenset(m for m in found if m == "hybridkv" or m.startswith("hybridkv."))


def package_graph(root: Path = ROOT) -> dict[str, set[str]]:
    graph: dict[str, set[str]] = defaultdict(set)
    for path in sorted(root.rglob("*.py")):
        module = _module_name(path, root)
        src = _node(module)
        graph[src]  # every node shows, also one importing nothing
        for target in _imports(path, module):
            dst = _node(target)
            if dst != src:
                graph[src].add(dst)
    return dict(graph)


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle as a path ``[a, b, ..., a]``, or None."""
    state: dict[str, int] = {}  # 1 = on the stack, 2 = done
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt) :] + [nxt]
            if nxt not in state and (cycle := visit(nxt)) is not None:
                return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)) is not None:
            return cycle
    return None


def violations(graph: dict[str, set[str]]) -> list[str]:
    bad = []
    for src, targets in sorted(graph.items()):
        if src in ALLOWED_ONLY:
            bad += [f"{src} -> {t}" for t in sorted(targets - ALLOWED_ONLY[src])]
        else:
            bad += [f"{src} -> {t}" for t in sorted(targets & FORBIDDEN.get(src, set()))]
    return bad


def test_no_cycle_between_packages() -> None:
    graph = package_graph()
    assert {"kv", "sched", "model", "engine", "connectors", "step_io", "paths"} <= set(graph)
    assert find_cycle(graph) is None, f"import cycle: {' -> '.join(find_cycle(graph) or [])}"


def test_layering_rules() -> None:
    assert violations(package_graph()) == []


def test_the_checks_catch_what_they_guard(tmp_path: Path) -> None:
    """The graph reader and both checks on a made-up tree with one of each fault."""
    pkg = tmp_path / "hybridkv"
    for name, text in {
        "__init__.py": "",
        "kv/__init__.py": "from hybridkv.sched import x\n",
        "sched/__init__.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
        "    from hybridkv.kv import y\n",
        "model/runner.py": "def f():\n    import hybridkv.sched.output\n",
        "native/__init__.py": "from ..engine import default_model\n",
        "engine/__init__.py": "",
    }.items():
        (pkg / name).parent.mkdir(parents=True, exist_ok=True)
        (pkg / name).write_text(text)
    graph = package_graph(pkg)
    assert find_cycle(graph) in (["kv", "sched", "kv"], ["sched", "kv", "sched"])
    assert violations(graph) == ["kv -> sched", "model -> sched", "native -> engine"]


def module_graph(package: str, root: Path = ROOT) -> dict[str, set[str]]:
    """Imports between the modules of one package (``sched`` -> ``{"scheduler": {...}}``)."""
    graph: dict[str, set[str]] = {}
    prefix = f"hybridkv.{package}."
    names = {p.stem for p in (root / package).glob("*.py")}
    for path in sorted((root / package).glob("*.py")):
        module = _module_name(path, root)
        targets = {t.removeprefix(prefix).split(".")[0] for t in _imports(path, module)}
        graph[path.stem] = (targets & names) - {path.stem}
    return graph


def test_no_cycle_between_the_scheduler_modules() -> None:
    """The scheduler applies what ``KVTransfer`` and ``Recovery`` plan; they never import it."""
    graph = module_graph("sched")
    assert graph["recovery"] == {"kv_transfer"}
    assert find_cycle(graph) is None, find_cycle(graph)


def file_graph(root: Path = ROOT) -> dict[str, set[str]]:
    """Imports between the package's modules (``from pkg import mod`` is an import of ``mod``);
    a package's own ``__init__`` seen from inside it is not an edge (Python runs it first)."""
    paths = {_module_name(p, root): p for p in sorted(root.rglob("*.py"))}
    graph: dict[str, set[str]] = {}
    for module, path in paths.items():
        found = set()
        for node in ast.walk(_tree(path)):
            if isinstance(node, ast.ImportFrom) and node.module and not node.level:
                found.update(f"{node.module}.{a.name}" for a in node.names)
        found = {m for m in found | _imports(path, module) if m in paths and m != module}
        graph[module] = {m for m in found if not module.startswith(m + ".")}
    return graph


def test_no_file_circles() -> None:
    """No module imports, even for typing, a module that imports it back: a type a helper
    needs of its owner is a Protocol beside the helper, a shared type lives below both."""
    graph = file_graph()
    assert "hybridkv.kv.coordinator" in graph and graph["hybridkv.kv.coordinator"]
    assert find_cycle(graph) is None, f"file circle: {' -> '.join(find_cycle(graph) or [])}"


def test_connector_folders_share_only_the_top_level() -> None:
    """One connector's folder never imports another's: what two share (``base``, ``config``,
    ``registry``, ``part_error``...) is a module directly in ``connectors/``."""
    bad = []
    for module, targets in file_graph().items():
        parts = module.split(".")
        if len(parts) < 4 or parts[1] != "connectors" or parts[2] not in CONNECTOR_FOLDERS:
            continue
        for target in targets:
            other = target.split(".")
            if other[1] == "connectors" and len(other) > 3 and other[2] != parts[2]:
                bad.append(f"{module} -> {target}")
    assert bad == []


def test_the_file_circle_check_catches_one(tmp_path: Path) -> None:
    pkg = tmp_path / "hybridkv"
    for name, text in {
        "__init__.py": "",
        "kv/__init__.py": "",
        "kv/a.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from hybridkv.kv import b\n",
        "kv/b.py": "def f():\n    from hybridkv.kv.a import x\n",
        "kv/c.py": "from hybridkv.kv import a\n",
    }.items():
        (pkg / name).parent.mkdir(parents=True, exist_ok=True)
        (pkg / name).write_text(text)
    graph = file_graph(pkg)
    assert graph["hybridkv.kv.c"] == {"hybridkv.kv.a"}
    assert find_cycle(graph) in (
        ["hybridkv.kv.a", "hybridkv.kv.b", "hybridkv.kv.a"],
        ["hybridkv.kv.b", "hybridkv.kv.a", "hybridkv.kv.b"],
    )
