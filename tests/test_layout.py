"""The code layout (docs/layout.md) against the code: the imports between onmt_lite's rooms follow
the table "the rooms and what each may import", no modules import each other in a circle, and
modules and functions stay small enough to read at once.

Imports are read with ``ast``, not run. An import counts wherever it stands: at module level or
inside a function (a function-level import is still a dependency, only a later one), and both
kinds together must form no circle. ``from onmt_lite.translate import batching`` counts as an
import of the module onmt_lite.translate.batching, ``from onmt_lite.translate import
build_translator`` as one of the package onmt_lite.translate (its ``__init__.py``). The implicit
import of a module's parent packages is not counted: every ``__init__.py`` that exports its
package's API would otherwise close a circle with its own modules."""
import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "onmt_lite"
TOP = "top-level"  # the modules directly under onmt_lite/ (constants, errors, options, ...)

# room -> the rooms it must not import (docs/layout.md): lower rooms never import higher ones
FORBIDDEN = {
    "cli": set(),
    "serve": {"cli"},
    "translate": {"cli", "serve", "train"},
    "train": {"cli", "serve", "translate", "search"},
    "search": {"cli", "serve", "translate", "train"},
    "models": {"cli", "serve", "translate", "train", "search"},
    TOP: {"cli", "serve", "translate", "train", "search"},
}
# the two modules above every room: the package's public API and python -m onmt_lite
ENTRY_POINTS = {"onmt_lite": {"translate"}, "onmt_lite.__main__": {"cli"}}

MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 120


def modules() -> dict:
    """Dotted name -> path of every module of onmt_lite (a package by its __init__.py)."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


MODULES = modules()


def _known(name: str):
    """The onmt_lite module that ``name`` is or lies in (None: not onmt_lite's)."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def imports_of(path: Path) -> set:
    """The onmt_lite modules that the module at ``path`` imports, at module level or in its
    functions."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(_known(alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.update(_known(f"{node.module}.{alias.name}") or _known(node.module)
                         for alias in node.names)
    return found - {None}


GRAPH = {name: imports_of(path) - {name} for name, path in MODULES.items()}


def room(name: str) -> str:
    """onmt_lite.serve.app -> serve; onmt_lite.vocab -> top-level; the entry points by name."""
    if name in ENTRY_POINTS:
        return name
    parts = name.split(".")
    return parts[1] if MODULES[name].name == "__init__.py" or len(parts) > 2 else TOP


def test_the_parser_of_imports_sees_each_kind():
    assert "onmt_lite.translate.batching" in GRAPH["onmt_lite.translate.translator"]
    assert "onmt_lite.translate.build" in GRAPH["onmt_lite.serve.lane_process"]  # in a function
    assert "onmt_lite.translate" in GRAPH["onmt_lite"]  # the package: its __init__.py
    assert "onmt_lite.cli" not in GRAPH["onmt_lite.cli.translate"]  # parents: not counted


def test_each_room_imports_only_what_the_layout_allows():
    wrong = []
    for name, imported in GRAPH.items():
        mine = room(name)
        for other in imported:
            theirs = room(other)
            refused = theirs not in ENTRY_POINTS.get(mine, set()) if mine in ENTRY_POINTS \
                else theirs in FORBIDDEN[mine] or theirs in ENTRY_POINTS
            if refused:
                wrong.append(f"{name} ({mine}) imports {other} ({theirs})")
    assert not wrong, "\n".join(wrong)


def test_nothing_under_serve_imports_cli():
    assert not [name for name in GRAPH if name.startswith("onmt_lite.serve")
                for other in GRAPH[name] if other.startswith("onmt_lite.cli")]


def test_models_and_search_import_no_translator_server_or_command():
    higher = ("onmt_lite.translate", "onmt_lite.serve", "onmt_lite.cli")
    assert not [(name, other) for name in GRAPH
                if name.startswith(("onmt_lite.models", "onmt_lite.search"))
                for other in GRAPH[name] if other.startswith(higher)]


def test_no_import_circle():
    """Depth-first search over the modules; a module met again on the current path closes a
    circle, reported from its first module."""
    done, path, circles = set(), [], []

    def visit(name: str) -> None:
        path.append(name)
        for other in sorted(GRAPH[name]):
            if other in path:
                circles.append(" -> ".join(path[path.index(other):] + [other]))
            elif other not in done:
                visit(other)
        path.pop()
        done.add(name)

    for name in sorted(GRAPH):
        if name not in done:
            visit(name)
    assert not circles, "\n".join(circles)


@pytest.mark.parametrize("name", sorted(MODULES))
def test_modules_and_functions_stay_small(name):
    path = MODULES[name]
    where = path.relative_to(ROOT).as_posix()
    text = path.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= MAX_MODULE_LINES, f"{where}: over {MAX_MODULE_LINES} lines"
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            length = node.end_lineno - node.lineno + 1
            assert length <= MAX_FUNCTION_LINES, \
                f"{where}:{node.lineno} {node.name}: {length} lines (at most {MAX_FUNCTION_LINES})"

