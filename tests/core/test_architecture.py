"""The layering rules, enforced on the source: the core decides, the adapters translate.

- No module under ``flexiq_plugins/`` imports Celery, Dramatiq, kombu or an
  adapter package, at any level (a lazy import inside a function counts).
- No adapter imports a private core module (``flexiq_plugins._*``) or a core
  module other than the package root and ``flexiq_plugins.integration``.
- No import cycle inside or between the three packages (``TYPE_CHECKING``
  imports count: a cycle hidden there is still a cycle of concepts).
- The core's layers import downward only: ``errors`` → ``_model`` → ``_store`` →
  ``_steps`` → ``_attempt`` → ``_delivery`` → the faces (the package root,
  ``integration``, ``operations``, ``testing``) → the surfaces over them
  (``cli``, ``pytest_plugin``, ``dashboard``). A module imports its own layer
  package and those below; faces do not import each other.
- The top of ``flexiq_plugins/`` holds only the faces; every other module lives
  in a layer package, and what is private is named so.
- Every error class of ``flexiq_plugins.errors`` is exported from the package root.
"""

from __future__ import annotations

import ast
import inspect
from collections.abc import Iterator
from pathlib import Path

import pytest

import flexiq_plugins
from flexiq_plugins import errors

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("flexiq_plugins", "celery_ext", "dramatiq_ext")
FRAMEWORKS = ("celery", "dramatiq", "kombu", "celery_ext", "dramatiq_ext")
ADAPTER_MAY_IMPORT = ("flexiq_plugins", "flexiq_plugins.integration")
LAYERS: tuple[tuple[str, ...], ...] = (
    ("errors",),
    ("_model",),
    ("_store",),
    ("_steps",),
    ("_attempt",),
    ("_delivery",),
    ("", "integration", "operations", "testing"),  # "": the package root
    ("cli", "pytest_plugin", "dashboard"),
)
"""The core's layers, lowest first: each entry a layer, each name a unit of it (a module or a package)."""
MAX_TOP_LEVEL_MODULES = 12


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _sources(package: str) -> Iterator[tuple[str, Path]]:
    for path in sorted((ROOT / package).rglob("*.py")):
        if "migrations" not in path.parts:
            yield _module_name(path), path


def _imports(module: str, path: Path, known: frozenset[str] = frozenset()) -> Iterator[str]:
    """Every module ``module`` imports, absolute; ``from p import m`` of a known module ``p.m`` is an edge to it."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = _resolve(package, node.module, node.level)
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                yield sub if sub in known else base


def _resolve(package: str, name: str | None, level: int) -> str:
    if level == 0:
        return name or ""
    parts = package.split(".")
    parts = parts[: len(parts) - (level - 1)]
    return ".".join([*parts, name] if name else parts)


def _graph() -> dict[str, set[str]]:
    modules = {name: path for package in PACKAGES for name, path in _sources(package)}
    known = frozenset(modules)
    graph = {}
    for name, path in modules.items():
        graph[name] = {i for i in _imports(name, path, known) if i in known and i != name}
    return graph


def test_architecture_core_imports_no_framework_and_no_adapter():
    """No module of ``flexiq_plugins`` imports celery, dramatiq, kombu, celery_ext or dramatiq_ext."""
    offenders = [
        f"{module} imports {name}"
        for module, path in _sources("flexiq_plugins")
        for name in _imports(module, path)
        if name.split(".")[0] in FRAMEWORKS
    ]
    assert offenders == []


@pytest.mark.parametrize("adapter", ["celery_ext", "dramatiq_ext"])
def test_architecture_adapters_use_only_the_public_core(adapter):
    """An adapter imports only ``flexiq_plugins`` and ``flexiq_plugins.integration`` from the core."""
    offenders = []
    for module, path in _sources(adapter):
        for node in ast.walk(ast.parse(path.read_text())):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom) and node.level == 0
                else []
            )
            offenders += [
                f"{module} imports {n}" for n in names if n.startswith("flexiq_plugins") and n not in ADAPTER_MAY_IMPORT
            ]
    assert offenders == []


def test_architecture_has_no_import_cycle():
    """The module import graph of the three packages is acyclic (a package's ``__init__`` included)."""
    graph = _graph()
    state: dict[str, int] = {}
    cycles: list[list[str]] = []

    def visit(node: str, trail: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycles.append([*trail[trail.index(nxt) :], nxt] if nxt in trail else [node, nxt])
            elif nxt not in state:
                visit(nxt, [*trail, nxt])
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    assert cycles == []


def _unit(module: str) -> str:
    """The layer unit of a core module: its first name under ``flexiq_plugins`` ("" for the root)."""
    return module.split(".")[1] if "." in module else ""


def _rank(module: str) -> int:
    unit = _unit(module)
    ranks = [n for n, layer in enumerate(LAYERS) if unit in layer]
    assert ranks, f"{module} is in no layer: add its unit to LAYERS or move it into a layer package"
    return ranks[0]


def test_architecture_layers_import_downward_only():
    """A core module imports only its own unit and lower layers: never a higher layer, never another face."""
    graph = _graph()
    offenders = [
        f"{module} (layer {_rank(module)}) imports {name} (layer {_rank(name)})"
        for module, names in sorted(graph.items())
        if module.startswith("flexiq_plugins")
        for name in sorted(names)
        if name.startswith("flexiq_plugins") and _unit(name) != _unit(module) and _rank(name) >= _rank(module)
    ]
    assert offenders == []


def test_architecture_the_top_level_holds_only_the_faces():
    """``flexiq_plugins/`` holds at most 12 modules, all faces; every other module is in a private layer package."""
    core = ROOT / "flexiq_plugins"
    top = sorted(p.stem for p in core.glob("*.py") if p.stem != "__init__")
    packages = sorted(p.name for p in core.iterdir() if p.is_dir() and p.name != "__pycache__")
    faces = {unit for layer in LAYERS[6:] for unit in layer} | {"errors"}
    assert len(top) + len(packages) <= MAX_TOP_LEVEL_MODULES
    assert [name for name in top + packages if name not in faces and not name.startswith("_")] == []
    assert {unit for layer in LAYERS[1:6] for unit in layer} <= set(packages)


def test_architecture_every_core_folder_is_a_package():
    """Every folder of the core has an ``__init__.py`` (no namespace package the API reference would miss)."""
    core = ROOT / "flexiq_plugins"
    folders = [p for p in core.rglob("*") if p.is_dir() and p.name != "__pycache__" and any(p.glob("*.py"))]
    missing = [
        str(p.relative_to(ROOT)) for p in folders if not (p / "__init__.py").exists() and "migrations" not in p.parts
    ]
    assert missing == []


def test_architecture_private_modules_are_named_private():
    """Inside a face package (``operations``, ``cli``) every module but its ``__init__`` starts with ``_``."""
    named_public = [
        f"flexiq_plugins/{face}/{path.name}"
        for face in ("operations", "cli")
        for path in (ROOT / "flexiq_plugins" / face).glob("*.py")
        if path.name != "__init__.py" and not path.name.startswith("_")
    ]
    assert named_public == []


def test_architecture_the_checks_see_real_imports():
    """The graph is not empty and sees known edges, so the rules above cannot pass vacuously."""
    graph = _graph()
    assert "flexiq_plugins._steps.journal" in graph["flexiq_plugins._steps.context"]
    assert "flexiq_plugins.integration" in graph["celery_ext._verbs"]
    assert "flexiq_plugins._attempt.driver" in graph["flexiq_plugins.integration"]
    assert _rank("flexiq_plugins._store.base") < _rank("flexiq_plugins._steps.journal")
    assert _rank("flexiq_plugins.cli._main") > _rank("flexiq_plugins.operations")


def test_architecture_every_error_is_exported_from_the_root():
    """Each exception class defined in ``flexiq_plugins.errors`` is importable from ``flexiq_plugins``."""
    defined = {
        name
        for name, obj in vars(errors).items()
        if inspect.isclass(obj) and issubclass(obj, BaseException) and obj.__module__ == errors.__name__
    }
    assert defined
    assert defined - set(flexiq_plugins.__all__) == set()
