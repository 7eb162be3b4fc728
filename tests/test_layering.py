"""The dependency picture: no import cycles between drift_cli's modules, and the layers that
must stay free of a library stay free of it (counting lazy, function-level imports too)."""

from __future__ import annotations

import ast
from pathlib import Path

import drift_cli

ROOT = Path(drift_cli.__file__).parent


def module_name(path: Path) -> str:
    return ".".join(("drift_cli",) + path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")


def import_graph() -> dict[str, set[str]]:
    """module -> the drift_cli modules it imports anywhere in its body."""
    mods = {module_name(p): p for p in ROOT.rglob("*.py")}
    graph = {}
    for name, path in mods.items():
        pkg = name if path.name == "__init__.py" else name.rpartition(".")[0]
        deps: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                deps.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = pkg.split(".")[: len(pkg.split(".")) - node.level + 1]
                    base = ".".join(parts + ([base] if base else []))
                deps.update(f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names)
        graph[name] = {d for d in deps if d in mods and d != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[frozenset[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while True:
                w = stack.pop()
                comp.add(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(frozenset(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_the_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [frozenset("abc")]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycles():
    graph = import_graph()
    assert "drift_cli.scenarios.source" in graph and graph["drift_cli.scenarios.extractors"]
    found = set(cycles(graph))
    assert not found, [sorted(c) for c in found]


def test_the_method_interface_does_not_import_click():
    """Flags are generated from the settings dataclasses in the CLI layer (commands/options.py)."""
    for path in [ROOT / "methods" / "base.py", ROOT / "knobs.py", *(ROOT / "methods").glob("*.py")]:
        tree = ast.parse(path.read_text())
        names = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        names |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
        assert not any(n == "click" or n.startswith("click.") for n in names), path


def package_imports(graph: dict[str, set[str]], package: str) -> set[str]:
    """The drift_cli modules outside `package` that its modules import (lazily included)."""
    inside = lambda m: m == package or m.startswith(package + ".")  # noqa: E731
    return {d for m, deps in graph.items() if inside(m) for d in deps if not inside(d)}


def test_the_engine_imports_no_method_and_the_suites_no_command():
    """The engine owns its interface (drift_cli.engine.policy): the methods plug into it, never the
    reverse; suites type-check their settings from the settings classes, not from the CLI."""
    graph = import_graph()
    engine = package_imports(graph, "drift_cli.engine")
    assert "drift_cli.engine.policy" in graph and "drift_cli.engine.loop" in graph
    assert not {m for m in engine if m == "drift_cli.methods" or m.startswith("drift_cli.methods.")}, engine
    suite = package_imports(graph, "drift_cli.suite")
    assert not {m for m in suite if m.startswith("drift_cli.commands")}, suite
    assert package_imports({"a.x": {"b.y", "a.z"}, "a.z": set(), "b.y": set()}, "a") == {"b.y"}


def test_the_heads_import_no_method_and_the_engine_no_head():
    """EAGLE heads plug into the methods' draft LM (drift_cli.methods.base picks the drafter); the
    engine only records target states for whoever asks, and knows nothing of heads."""
    graph = import_graph()
    assert "drift_cli.eagle.drafter" in graph and "drift_cli.eagle.layout" in graph
    eagle = package_imports(graph, "drift_cli.eagle")
    assert not {m for m in eagle if m.startswith(("drift_cli.methods", "drift_cli.commands", "drift_cli.bench"))}, eagle
    engine = package_imports(graph, "drift_cli.engine")
    assert not {m for m in engine if m.startswith("drift_cli.eagle")}, engine


def test_the_head_layout_module_imports_no_model_library():
    """`drift bench` checks --draft-kind against a checkpoint before torch loads."""
    for path in [ROOT / "eagle" / "__init__.py", ROOT / "eagle" / "layout.py"]:
        tree = ast.parse(path.read_text())
        names = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        names |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
        assert not {n for n in names if n.split(".")[0] in ("torch", "transformers", "safetensors")}, path
