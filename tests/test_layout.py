"""The package layout is the architecture: subpackages follow the data's way through the
system, nothing imports in a circle, and the model stands alone."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "seq2seq"


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> set[str]:
    """Every seq2seq module ``path`` imports, at module level or inside a function."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("seq2seq"):
            found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names)  # `from pkg import mod`
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("seq2seq"))
    return found


MODULES = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
GRAPH = {name: {m for m in _imports(path) if m in MODULES and m != name}
         for name, path in MODULES.items()}


def test_no_import_cycles() -> None:
    # package __init__ files re-export their own submodules; an edge into a package's own
    # __init__ from inside it is not a cycle of the architecture
    graph = {m: {d for d in deps if not m.startswith(d + ".")} for m, deps in GRAPH.items()}
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for dep in sorted(graph[node]):
            if state.get(dep) == 1:
                cycle = stack[stack.index(dep):] + [dep]
                pytest.fail("import cycle: " + " -> ".join(cycle))
            if dep not in state:
                visit(dep)
        stack.pop()
        state[node] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module)


# seq2seq.native: C kernels behind plain tensor functions, importing nothing of seq2seq
LOWER_LAYERS = {"seq2seq", "seq2seq.errors", "seq2seq.constants", "seq2seq.config",
                "seq2seq.config.schema", "seq2seq.config.checks", "seq2seq.native"}


@pytest.mark.parametrize("module", sorted(m for m in MODULES if m.startswith("seq2seq.model")))
def test_the_model_imports_only_the_model_and_its_config(module: str) -> None:
    outside = {d for d in GRAPH[module]
               if not d.startswith("seq2seq.model") and d not in LOWER_LAYERS}
    assert not outside, f"{module} imports {sorted(outside)}"


def test_the_native_kernels_import_nothing_of_seq2seq_but_their_own_modules() -> None:
    native = [m for m in MODULES if m.split(".")[:2] == ["seq2seq", "native"]]
    assert {"seq2seq.native", "seq2seq.native.build"} <= set(native)
    for module in native:
        outside = {d for d in GRAPH[module] if d.split(".")[:2] != ["seq2seq", "native"]}
        assert not outside, f"{module} imports {sorted(outside)}"


def test_the_reference_model_imports_nothing_of_the_fast_one() -> None:
    assert not GRAPH["seq2seq.model.reference"], GRAPH["seq2seq.model.reference"]


def test_every_subpackage_has_a_docstring_and_no_file_is_over_400_lines() -> None:
    for name, path in MODULES.items():
        text = path.read_text(encoding="utf-8")
        assert len(text.splitlines()) <= 400, f"{path} has {len(text.splitlines())} lines"
        if path.name == "__init__.py":
            assert ast.get_docstring(ast.parse(text)), f"{name} says nothing about itself"
