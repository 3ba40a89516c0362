"""The package's imports run one way: no module imports, directly or through others, a module that
imports it back, and no module hides an import of another package module inside a function (the
usual way to dodge a circle). Read from the source with ``ast``, so every module is checked, also
those no test imports."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

PACKAGE_DIR = Path(__file__).resolve().parent.parent / "attn_course"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE_DIR.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {_module_name(path): path for path in sorted(PACKAGE_DIR.rglob("*.py"))}


def _package_of(name: str) -> str:
    """The package a module's relative imports start from (a package's ``__init__`` is its own)."""
    return name if MODULES[name].name == "__init__.py" else name.rpartition(".")[0]


def _targets(name: str, node: ast.AST) -> list[str]:
    """The package modules an ``import`` or ``from ... import`` statement of module ``name`` loads."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names if alias.name in MODULES]
    if not isinstance(node, ast.ImportFrom):
        return []
    if node.level:  # relative: one dot is the module's own package, each further dot one package up
        base = _package_of(name)
        for _ in range(node.level - 1):
            base = base.rpartition(".")[0]
        base = f"{base}.{node.module}" if node.module else base
    else:
        base = node.module or ""
    if base not in MODULES:
        return []
    # `from package import submodule` loads the submodule; `from module import name` the module.
    submodules = [f"{base}.{alias.name}" for alias in node.names if f"{base}.{alias.name}" in MODULES]
    return submodules or [base]


def _imports(name: str) -> tuple[set[str], list[tuple[int, str]]]:
    """``(imported at import time, [(line, module) imported inside a function]``) for module ``name``."""
    tree = ast.parse(MODULES[name].read_text(encoding="utf-8"))
    at_import, in_functions = set(), []

    def visit(node: ast.AST, inside_function: bool) -> None:
        for target in _targets(name, node):
            if target == name:
                continue
            if inside_function:
                in_functions.append((node.lineno, target))
            else:
                at_import.add(target)
        inside = inside_function or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
        for child in ast.iter_child_nodes(node):
            visit(child, inside)

    visit(tree, False)
    return at_import, in_functions


GRAPH = {name: _imports(name)[0] for name in MODULES}


def _find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One circle of the directed graph as a list of modules (first == last), or None."""
    state, stack = {}, []  # state: 1 = on the current path, 2 = done

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for target in sorted(graph.get(node, ())):
            if state.get(target) == 1:
                return stack[stack.index(target):] + [target]
            if target not in state:
                found = visit(target)
                if found:
                    return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def test_the_checker_sees_circles_and_resolves_relative_imports():
    assert _find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert _find_cycle({"a": {"b"}, "b": {"c"}, "c": set(), "d": {"a", "c"}}) is None
    assert "attn_course.multihead" in GRAPH["attn_course.caches"]  # `from .multihead import ...`
    assert "attn_course.caches" in GRAPH["attn_course.gqa"]
    assert "attn_course._checks" in GRAPH["attn_course.translator.decoding"]  # `from .._checks import ...`
    assert "attn_course.decoder" in GRAPH["attn_course"]  # the package's __init__ re-exports it


def test_the_package_has_no_import_circle():
    cycle = _find_cycle(GRAPH)
    assert cycle is None, "import circle: " + " -> ".join(cycle)
    everything = {name: GRAPH[name] | {target for _, target in _imports(name)[1]} for name in MODULES}
    cycle = _find_cycle(everything)  # counting the imports inside functions too
    assert cycle is None, "import circle through an import inside a function: " + " -> ".join(cycle)


def test_no_module_imports_a_package_module_inside_a_function():
    """An import inside a function hides a dependency (the usual way to dodge a circle). One of a
    module already imported at the top hides nothing (it reads an attribute late, e.g. one built
    lazily), so it is allowed."""
    hidden = [f"{MODULES[name].relative_to(PACKAGE_DIR.parent)}:{line} imports {target}"
              for name in MODULES for line, target in _imports(name)[1] if target not in GRAPH[name]]
    assert not hidden, "imports inside functions (move them to the top; if that makes a circle, move code down):\n" + "\n".join(hidden)


def test_layers_run_one_way():
    """Mechanisms below the caches, the caches below the attention modules that build them, the
    decoder-only model on top; the old module names only re-export."""
    assert not GRAPH["attn_course.caches"] & {"attn_course.gqa", "attn_course.decoder", "attn_course.kv_cache"}
    assert "attn_course.decoder" not in set().union(*(GRAPH[name] for name in MODULES if name not in (
        "attn_course", "attn_course.kv_cache")))
    assert GRAPH["attn_course.kv_cache"] == {"attn_course.caches", "attn_course.decoder"}


@pytest.mark.parametrize("old, names", [
    ("attn_course.kv_cache", ["KVCache", "cached_self_attention", "DecoderOnlyLM", "generate", "POSITIONS"]),
    ("attn_course.gqa", ["GroupedQueryAttention", "RollingKVCache"]),
])
def test_old_import_paths_still_work(old, names):
    import attn_course as ac

    module = importlib.import_module(old)
    for name in names:
        assert hasattr(module, name), f"{old}.{name} is gone"
        if hasattr(ac, name):
            assert getattr(module, name) is getattr(ac, name), f"{old}.{name} is not attn_course.{name}"
