"""Size budgets of the code (STYLE.md: small files and functions): no function or method under
``src/hybridkv`` longer than 50 lines, no file longer than 320. The few that are over today
are listed with their current length as a ceiling: they may shrink (then lower or drop the
entry), never grow, and nothing new joins them."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "hybridkv"
MAX_FUNCTION_LINES = 50
MAX_FILE_LINES = 320
# over budget today: name -> its length now (a ceiling)
OVER_FUNCTIONS: dict[str, int] = {}
OVER_FILES: dict[str, int] = {}


def function_lengths(path: Path, root: Path = SRC) -> dict[str, int]:
    """``file:Class.function`` (or ``file:function``) -> lines, for every def in ``path``."""
    rel = path.relative_to(root).as_posix()
    out: dict[str, int] = {}

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.")
            elif isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                assert child.end_lineno is not None
                out[f"{rel}:{prefix}{child.name}"] = child.end_lineno - child.lineno + 1
                visit(child, f"{prefix}{child.name}.")

    visit(ast.parse(path.read_text()), "")
    return out


def test_functions_stay_within_their_budget() -> None:
    lengths = {k: v for p in sorted(SRC.rglob("*.py")) for k, v in function_lengths(p).items()}
    over = {name: n for name, n in lengths.items() if n > MAX_FUNCTION_LINES}
    grown = {
        n: (over[n], OVER_FUNCTIONS.get(n)) for n in over if over[n] > OVER_FUNCTIONS.get(n, 0)
    }
    assert not grown, f"functions over {MAX_FUNCTION_LINES} lines (now, allowed): {grown}"
    stale = sorted(set(OVER_FUNCTIONS) - set(over))
    assert not stale, f"back within budget or gone, drop from OVER_FUNCTIONS: {stale}"


def test_files_stay_within_their_budget() -> None:
    lines = {
        p.relative_to(SRC).as_posix(): len(p.read_text().splitlines()) for p in SRC.rglob("*.py")
    }
    over = {name: n for name, n in lines.items() if n > MAX_FILE_LINES}
    grown = {n: (over[n], OVER_FILES.get(n)) for n in over if over[n] > OVER_FILES.get(n, 0)}
    assert not grown, f"files over {MAX_FILE_LINES} lines (now, allowed): {grown}"
    stale = sorted(set(OVER_FILES) - set(over))
    assert not stale, f"back within budget, drop from OVER_FILES: {stale}"


def test_the_budget_check_sees_nested_and_method_definitions(tmp_path: Path) -> None:
    source = (
        "class A:\n    def f(self):\n        def g():\n            return 1\n        return g\n"
    )
    path = tmp_path / "probe.py"
    path.write_text(source)
    assert function_lengths(path, tmp_path) == {"probe.py:A.f": 4, "probe.py:A.f.g": 2}
