"""The project's imports point one way: schemas below the platform (`streamdi/`) below the jobs (`jobs/`) below the
entry points (`streamdi.run`, `dags/`, `bench/`), with no cycle among the modules.

Every import counts, also one inside a function: a deferred import is still a dependency.
No module reaches into another one's private names (a leading underscore).
"""

from __future__ import annotations

import ast
import graphlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("schemas", "streamdi", "jobs")
SCRIPTS = ("dags", "bench")

# Layer of a module, lowest first; a module may import its own layer and those below it.
LAYERS = ("schemas", "platform", "jobs", "entry")


def layer_of(module: str) -> str:
    top = module.split(".")[0]
    if top in SCRIPTS or module == "streamdi.run" or module.startswith("streamdi.run."):
        return "entry"
    return {"schemas": "schemas", "streamdi": "platform", "jobs": "jobs"}[top]


def project_modules() -> dict[str, Path]:
    modules = {}
    for top in PACKAGES + SCRIPTS:
        for path in sorted((ROOT / top).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            modules[".".join(parts)] = path
    return modules


def imported(path: Path, module: str, modules: dict[str, Path]) -> set[str]:
    """The project modules `path` imports (the longest project module each import names)."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
    found = set()
    for name in names:
        parts = name.split(".")
        for end in range(len(parts), 0, -1):
            candidate = ".".join(parts[:end])
            if candidate in modules:
                found.add(candidate)
                break
    found.discard(module)
    # `from streamdi.x import y` also imports the package `streamdi`: parents are not dependencies of note.
    return {m for m in found if not module.startswith(m + ".")}


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    modules = project_modules()
    return {module: imported(path, module, modules) for module, path in modules.items()}


def test_the_walk_sees_the_layers(graph):
    # Guards the walk itself: these edges exist, so a walk that finds none is broken.
    assert "jobs.transform" in graph["streamdi.run.pipeline"]
    assert "streamdi.lake" in graph["streamdi.batchlog"]
    assert "schemas.model" in graph["schemas.sources"]
    assert {layer_of(m) for m in graph} == set(LAYERS)


def test_no_upward_import(graph):
    upward = sorted(
        f"{module} ({layer_of(module)}) imports {target} ({layer_of(target)})"
        for module, targets in graph.items()
        for target in targets
        if LAYERS.index(layer_of(target)) > LAYERS.index(layer_of(module))
    )
    assert upward == []


def test_no_import_cycle(graph):
    try:
        graphlib.TopologicalSorter(graph).prepare()
    except graphlib.CycleError as cycle:
        pytest.fail(f"import cycle: {' -> '.join(cycle.args[1])}")


def private_reaches() -> list[str]:
    """`from module import _name` and `module._name` where the module is one of ours and not the importer."""
    modules = project_modules()
    found = []
    for module, path in modules.items():
        tree = ast.parse(path.read_text(), str(path))
        bound: dict[str, str] = {}  # local name -> the project module it is
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in PACKAGES + SCRIPTS:
                for alias in node.names:
                    if alias.name.startswith("_") and not alias.name.startswith("__"):
                        found.append(f"{module}:{node.lineno}: from {node.module} import {alias.name}")
                    if f"{node.module}.{alias.name}" in modules:
                        bound[alias.asname or alias.name] = f"{node.module}.{alias.name}"
            elif isinstance(node, ast.Import):
                bound.update(
                    {alias.asname: alias.name for alias in node.names if alias.asname and alias.name in modules}
                )
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and bound.get(node.value.id, module) != module
                and node.attr.startswith("_")
                and not node.attr.startswith("__")
            ):
                found.append(f"{module}:{node.lineno}: {node.value.id}.{node.attr}")
    return sorted(found)


def test_no_private_names_across_modules():
    # A leading underscore means "only this module relies on it"; reaching across that line ties two modules'
    # insides together. Tests may (they pin internals on purpose); the project's own modules may not.
    assert private_reaches() == []
