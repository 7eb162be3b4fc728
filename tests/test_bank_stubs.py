"""`drift_cli/_bank.pyi` names exactly what the Rust extension exports (functions, classes and
their public methods and properties), so the stubs stay in step with the code."""

import ast
from pathlib import Path

from drift_cli import _bank

STUBS = Path(_bank.__file__).with_name("_bank.pyi")


def _public(names):
    return {n for n in names if not n.startswith("_")}


def _stubbed():
    tree = ast.parse(STUBS.read_text())
    top, members = set(), {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            top.add(node.name)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            top.add(node.target.id)
        if isinstance(node, ast.ClassDef):
            members[node.name] = _public(n.name for n in node.body if isinstance(n, ast.FunctionDef))
    return _public(top), members


def test_stubs_name_every_export_and_nothing_else():
    top, _ = _stubbed()
    exported = _public(name for name in dir(_bank))
    assert top == exported, f"only in the stubs: {sorted(top - exported)}; only in the module: {sorted(exported - top)}"


def test_stubbed_classes_list_their_public_members():
    _, members = _stubbed()
    for name in ("Books", "CpuBank"):
        cls = getattr(_bank, name)
        assert members[name] == _public(vars(cls)), name
