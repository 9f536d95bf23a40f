"""The package's layout rules, read from its source with ``ast``: no module imports
another's private names, the imports (function-level ones included) have no cycle, and
the settings import nothing of pgmb."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pgmb

ROOT = Path(pgmb.__file__).parent


def _modules() -> dict[str, tuple[Path, bool]]:
    found = {}
    for path in sorted(ROOT.rglob("*.py")):
        parts = ["pgmb", *path.relative_to(ROOT).with_suffix("").parts]
        package = parts[-1] == "__init__"
        found[".".join(parts[:-1] if package else parts)] = (path, package)
    return found


MODULES = _modules()


def _type_checking_only(tree: ast.Module) -> set[int]:
    """ids of the nodes under ``if TYPE_CHECKING:`` (never run)."""
    skipped = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and ast.unparse(node.test).endswith("TYPE_CHECKING"):
            skipped.update(id(child) for top in node.body for child in ast.walk(top))
    return skipped


def _imports(module: str) -> list[tuple[str, str | None]]:
    """(pgmb module imported, name imported from it or None) for each import that runs."""
    path, package = MODULES[module]
    tree = ast.parse(path.read_text(), str(path))
    skipped = _type_checking_only(tree)
    found: list[tuple[str, str | None]] = []
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            found += [(alias.name, None) for alias in node.names if alias.name in MODULES]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")[: None if package else -1]
                base = base[: len(base) - node.level + 1]
                source = ".".join([*base, *([node.module] if node.module else [])])
            else:
                source = node.module or ""
            if source not in MODULES:
                continue
            for alias in node.names:
                submodule = f"{source}.{alias.name}"
                found.append((submodule, None) if submodule in MODULES else (source, alias.name))
    return found


def test_no_module_imports_another_modules_private_names():
    offences = [
        f"{module} imports {name} from {source}"
        for module in MODULES
        for source, name in _imports(module)
        if name is not None and name.startswith("_") and not name.startswith("__")
        if source != module
    ]
    assert offences == []


def test_the_imports_have_no_cycle():
    graph = {module: {source for source, _ in _imports(module)} - {module} for module in MODULES}
    path: list[str] = []
    state: dict[str, str] = {}  # "open" while on the path, "done" once explored
    cycles: list[list[str]] = []

    def visit(module: str) -> None:
        state[module] = "open"
        path.append(module)
        for target in sorted(graph[module]):
            if state.get(target) == "open":
                cycles.append([*path[path.index(target) :], target])
            elif target not in state:
                visit(target)
        path.pop()
        state[module] = "done"

    for module in sorted(graph):
        if module not in state:
            visit(module)
    assert [" → ".join(cycle) for cycle in cycles] == []


def test_the_settings_import_only_leaves():
    """pgmb.conf imports at most modules that import nothing of pgmb (its defaults and
    rules), so reading a setting loads nothing else."""
    leaves = {source for source, _ in _imports("pgmb.conf")}
    assert all(_imports(leaf) == [] for leaf in leaves), leaves
    loaded = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, pgmb.conf; print(*sorted(m for m in sys.modules if m.startswith('pgmb')))",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    assert loaded.stdout.split() == sorted({"pgmb", "pgmb.conf", *leaves})


def test_the_models_import_neither_the_dispatcher_nor_what_uses_them():
    below = {source for source, _ in _imports("pgmb.models")}
    assert not [m for m in below if m.startswith("pgmb.dispatch")]
    assert not [m for m in below if "pgmb.models" in {s for s, _ in _imports(m)}]
