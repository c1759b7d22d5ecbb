"""Every repository path and every ``hybridkv`` dotted reference named in backticks in
``docs/*.md`` and ``README.md`` exists, read from the files with ``ast`` (nothing is imported,
no model: the fast tier).

The rules (what the docs may write):

- a path (``src/hybridkv/kv/spec.py``, ``benchmarks/pd.py``, ``docs/offloading.md``, a folder
  ending in ``/``) resolves from the repository root or from ``src/`` or ``src/hybridkv/``;
  written relative to a package (``connectors/offloading/tier_base.py``, ``layers/linear.py``)
  it is the tail of exactly such a path; a bare file name (``runner.py``) names some file of
  the repository;
- ``hybridkv/kv`` (a folder of the package, no trailing ``/``) resolves under ``src/``;
- ``tests/x.py::test_name`` is a path and a name defined in that file;
- a command (``benchmarks/pd.py --repeats 3``, ``pd_floor.py --sweep``): its first word, if a path;
- ``hybridkv.a.b`` / ``hybridkv.a.b:Attr`` / ``a.b.Attr`` where ``a`` is a top-level package
  or module of hybridkv: the longest prefix is a module, and the rest are names defined in it
  (a class's rest in its body; a call's ``(...)`` is dropped); in fenced code blocks, the quoted
  ``"hybridkv.a.b:Attr"`` strings (a registry entry's targets) are read the same way;
- anything with ``<``, ``*``, ``{``, ``$``, ``~``, a space, or outside the repository
  (``/proc/...``, ``../shared/...``, ``vllm/...``, a URL) is a placeholder or not ours, and
  is skipped.
"""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "src" / "hybridkv"
DOCS = sorted((REPO / "docs").glob("*.md")) + [REPO / "README.md"]
PATH_SUFFIXES = (".py", ".md", ".c", ".h", ".sh", ".toml", ".cfg")
FILE_LIKE = PATH_SUFFIXES + (".json", ".txt", ".safetensors", ".gguf", ".yaml", ".so")
SKIP_CHARS = set("<*{$~ |=,'\"")
FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)
QUOTED_TARGET = re.compile(r"[\"'](hybridkv(?:\.\w+)+:\w[\w.]*)[\"']")
TICKED = re.compile(r"`([^`\n]+)`")
DOTTED = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)+(:[A-Za-z_][\w.]*)?$")
ROOTS = (REPO, REPO / "src", PACKAGE)
NOT_OURS = ("/", ".", "http", "vllm/", "site-packages/")  # absolute, relative up, vLLM's


@cache
def _repo_files() -> tuple[frozenset[str], frozenset[str]]:
    """Every tracked-looking file and folder, as paths relative to the repository."""
    files: set[str] = set()
    dirs: set[str] = set()
    for top in ("src", "tests", "benchmarks", "docs"):
        for path in (REPO / top).rglob("*"):
            if "__pycache__" in path.parts:
                continue
            (dirs if path.is_dir() else files).add(path.relative_to(REPO).as_posix())
    files.update(p.name for p in REPO.iterdir() if p.is_file())
    return frozenset(files), frozenset(dirs)


def references(text: str) -> list[str]:
    """The backticked spans of a markdown text outside fenced code blocks, and the quoted
    ``module:attr`` targets inside them."""
    fenced = [t for block in FENCE.findall(text) for t in QUOTED_TARGET.findall(block)]
    return TICKED.findall(FENCE.sub("", text)) + fenced


def path_exists(ref: str) -> bool:
    files, dirs = _repo_files()
    folder = ref.endswith("/")
    name = ref.rstrip("/")
    if any((root / name).exists() for root in ROOTS):
        return True
    pool = dirs if folder else files
    if "/" not in name:
        return any(p.rsplit("/", 1)[-1] == name for p in pool)
    return any(p.endswith("/" + name) for p in pool)


def is_path(ref: str) -> bool:
    if ref.startswith("hybridkv/") and re.fullmatch(r"[\w/]+", ref):
        return True
    if SKIP_CHARS & set(ref) or ":" in ref or ref.startswith(NOT_OURS):
        return False
    if ref.startswith("_") and not ref.startswith("__"):
        return False  # a fragment: `attention{_tile,_decode}.h` written as `_tile.h`
    if ref.endswith("/"):
        return "/" in ref[:-1] or (PACKAGE / ref).is_dir() or ref.count("/") == 1
    return ref.endswith(PATH_SUFFIXES) and re.fullmatch(r"[\w./-]+", ref) is not None


@cache
def _top_level_names() -> frozenset[str]:
    return frozenset(p.stem for p in PACKAGE.iterdir() if p.suffix == ".py" or p.is_dir())


@cache
def _module_tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), str(path))


def _module_file(parts: list[str]) -> Path | None:
    base = PACKAGE.joinpath(*parts)
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _defined(body: list[ast.stmt], name: str) -> ast.stmt | None:
    """The statement of ``body`` (module or class level) that binds ``name``."""
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            if node.name == name:
                return node
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            if any((a.asname or a.name.split(".")[0]) == name for a in node.names):
                return node
        elif isinstance(node, ast.Assign):
            targets = [t for tgt in node.targets for t in ast.walk(tgt)]
            if any(isinstance(t, ast.Name) and t.id == name for t in targets):
                return node
        elif isinstance(node, ast.AnnAssign):
            if isinstance(node.target, ast.Name) and node.target.id == name:
                return node
        elif isinstance(node, (ast.If, ast.Try)):  # TYPE_CHECKING, optional imports
            inner = node.body + node.orelse + getattr(node, "finalbody", [])
            for handler in getattr(node, "handlers", []):
                inner += handler.body
            if (found := _defined(inner, name)) is not None:
                return found
    return None


def dotted_exists(ref: str) -> bool:
    """``hybridkv.a.b[:X.y]`` or ``a.b.X`` (``a`` a top-level name of hybridkv)."""
    parts = ref.replace(":", ".").split(".")
    if parts[0] == "hybridkv":
        parts = parts[1:]
    for cut in range(len(parts), 0, -1):
        if (path := _module_file(parts[:cut])) is not None:
            break
    else:
        return False
    body: list[ast.stmt] = _module_tree(path).body
    for name in parts[cut:]:
        node = _defined(body, name)
        if node is None:
            return False
        if not isinstance(node, ast.ClassDef):
            return True  # a value, a function or an import: its attributes are not read
        body = node.body
    return True


def is_dotted(ref: str) -> bool:
    ref = ref.removesuffix("()")
    if ref.endswith(FILE_LIKE) or DOTTED.fullmatch(ref) is None:
        return False
    head = ref.split(".")[0]
    return head == "hybridkv" or head in _top_level_names()


def _strip_call(ref: str) -> str:
    return ref.split("(", 1)[0] if "(" in ref and ref.endswith(")") else ref


def _normalized(ref: str) -> str:
    """A command's first word; a call without its arguments."""
    ref = ref.strip()
    first = ref.split(" ", 1)[0]
    if first != ref and first.endswith(PATH_SUFFIXES):
        return first
    return _strip_call(ref)


def node_exists(ref: str) -> bool:
    """``path::name[::name]``: the file exists and defines the names (a class's in its body)."""
    path_part, *names = ref.split("::")
    if not path_exists(path_part) or not path_part.endswith(".py"):
        return False
    path = next((root / path_part for root in ROOTS if (root / path_part).is_file()), None)
    if path is None:  # written relative to a package: the one file it is the tail of
        files, _ = _repo_files()
        tails = [p for p in files if p.endswith("/" + path_part)]
        path = REPO / tails[0]
    body: list[ast.stmt] = _module_tree(path).body
    for name in names:
        node = _defined(body, name.split("[", 1)[0])  # a parametrized id: the function
        if node is None:
            return False
        body = node.body if isinstance(node, ast.ClassDef) else []
    return True


def exists(ref: str) -> bool:
    if "::" in ref:
        return node_exists(ref)
    return path_exists(ref) if is_path(ref) else dotted_exists(ref)


def is_checked(ref: str) -> bool:
    if "::" in ref:
        return is_path(ref.split("::", 1)[0])
    return is_path(ref) or is_dotted(ref)


def _cases() -> list[tuple[str, str]]:
    found: list[tuple[str, str]] = []
    for doc in DOCS:
        for ref in references(doc.read_text()):
            ref = _normalized(ref)
            if is_checked(ref):
                found.append((doc.relative_to(REPO).as_posix(), ref))
    return found


def test_the_docs_name_references() -> None:
    # the rules below must see something: a docs folder with no reference checks nothing
    assert len(_cases()) > 100


def test_every_named_path_and_module_exists() -> None:
    missing = [f"{doc}: `{ref}`" for doc, ref in _cases() if not exists(ref)]
    assert not missing, "stale references in the docs:\n" + "\n".join(missing)


@pytest.mark.parametrize(
    ("ref", "ok"),
    [
        ("src/hybridkv/kv/spec.py", True),
        ("connectors/offloading/tier_base.py", True),
        ("kv/", True),
        ("spec.py", True),
        ("connectors/offloading/no_such_file.py", False),
        ("docs/no_such_doc.md", False),
        ("hybridkv.kv.spec:FullAttentionSpec", True),
        ("hybridkv.kv.spec:NoSuchSpec", False),
        ("metrics.prometheus.METRICS", True),
        ("hybridkv.no_such_module", False),
        ("hybridkv/kv", True),
        ("hybridkv/no_such_folder", False),
        ("tests/test_docs_paths.py::test_the_docs_name_references", True),
        ("tests/test_docs_paths.py::test_no_such_test", False),
        ("benchmarks/pd.py --repeats 3", True),
        ("benchmarks/no_such_bench.py --quick", False),
    ],
)
def test_the_rules_tell_stale_from_present(ref: str, ok: bool) -> None:
    ref = _normalized(ref)
    assert is_checked(ref)
    assert exists(ref) is ok


def test_registry_targets_in_code_blocks_are_read() -> None:
    text = 'x\n```python\nregister(options="hybridkv.kv.spec:NoSuchSpec")\n```\n'
    assert references(text) == ["hybridkv.kv.spec:NoSuchSpec"]
    assert not dotted_exists("hybridkv.kv.spec:NoSuchSpec")
