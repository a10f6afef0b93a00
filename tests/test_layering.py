"""The package's layers, enforced: each imports only layers below it, and no module
imports itself back through others (at run time, lazily, or for type checking only).

The layers, lowest first, are the ones ``fsm_agent/__init__.py`` draws. Every import
statement counts, wherever it is (module level, inside a function, under
``TYPE_CHECKING``): an upward import hidden in a function is still an upward dependency.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "fsm_agent"

#: Lowest first. A module may import its own layer and the layers before it.
LAYERS = (
    "_version",
    "_errors",
    "_rules",
    "_core",
    "_trace",
    "_durable",
    "tools",
    "_runtime",
    "models",
    "otel",
    "_render",
    "testing",
    "server",
    "_cli",
    "sansio",
    "stores",
)
TOP = ("__init__", "__main__")


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> set[str]:
    """Every ``fsm_agent`` module ``path`` imports (resolved to real modules)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("fsm_agent")}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                base = ".".join(anchor[: len(anchor) - node.level + 1] + ([base] if base else []))
            if not base.startswith("fsm_agent"):
                continue
            for alias in node.names:  # `from pkg import module` imports that module
                candidate = f"{base}.{alias.name}"
                found.add(candidate if candidate in MODULES else base)
    return {m for m in found if m in MODULES}


MODULES = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
GRAPH = {name: _imports(path) for name, path in MODULES.items()}


def _layer(module: str) -> int:
    parts = module.split(".")
    if len(parts) == 1 or parts[1] in TOP:
        return len(LAYERS)
    return LAYERS.index(parts[1])


def test_the_layer_picture_draws_these_layers() -> None:
    # The picture in docs/architecture.md is drawn from render/layers.py's list: the
    # same layers in the same order (the private modules aside).
    from fsm_agent._render.layers import LAYERS as DRAWN

    # The picture names each part by its directory (private ones with their underscore),
    # except the two facades, which draw nothing of their own.
    drawn = tuple(layer for layer in LAYERS if layer not in ("_version", "sansio", "stores"))
    assert drawn == DRAWN


def test_every_module_belongs_to_a_layer() -> None:
    for module in MODULES:
        parts = module.split(".")
        assert len(parts) == 1 or parts[1] in LAYERS + TOP, f"{module} is in no layer"


def test_no_module_imports_a_layer_above_its_own() -> None:
    upward = [
        f"{module} ({LAYERS[_layer(module)]}) imports {target}"
        for module, targets in GRAPH.items()
        if _layer(module) < len(LAYERS)
        for target in targets
        if _layer(target) > _layer(module)
    ]
    assert upward == []


def test_core_does_no_io() -> None:
    """Nothing in ``core/`` imports a module that talks to the world."""
    io_modules = {
        "os",
        "socket",
        "sqlite3",
        "asyncio",
        "time",
        "subprocess",
        "threading",
        "pathlib",
        "io",
        "shutil",
        "random",
        "uuid",
    }
    for name, path in MODULES.items():
        if not name.startswith("fsm_agent._core"):
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        used = {
            a.name.split(".")[0]
            for n in ast.walk(tree)
            if isinstance(n, ast.Import)
            for a in n.names
        }
        used |= {
            (n.module or "").split(".")[0]
            for n in ast.walk(tree)
            if isinstance(n, ast.ImportFrom) and not n.level
        }
        # (No exemption: approval uses are spent by the store, through a request.)
        assert not used & io_modules, f"{name} imports {used & io_modules}"


def test_there_is_no_import_cycle() -> None:
    cycles: list[list[str]] = []
    state: dict[str, int] = {}  # 1 visiting, 2 done

    def visit(module: str, path: list[str]) -> None:
        state[module] = 1
        for target in sorted(GRAPH[module]):
            if state.get(target) == 1:
                cycles.append([*path[path.index(target) :], target])
            elif target not in state:
                visit(target, [*path, target])
        state[module] = 2

    for module in sorted(GRAPH):
        if module not in state:
            visit(module, [module])
    real = [c for c in cycles if not _reexport(c)]
    assert real == [], "\n".join(" -> ".join(c) for c in real)


def _reexport(cycle: list[str]) -> bool:
    """A package's ``__init__`` re-exporting its own modules is not a cycle of dependency:
    every module in the cycle is one package or inside it (by dotted name, so that
    ``cli.demo`` does not contain ``cli.demo_report``)."""
    top = min(cycle, key=len)
    return all(m == top or m.startswith(top + ".") for m in cycle)


def test_a_cycle_between_sibling_modules_is_not_a_reexport() -> None:
    assert not _reexport(
        ["fsm_agent._cli.demo", "fsm_agent._cli.demo_report", "fsm_agent._cli.demo"]
    )
    assert _reexport(["fsm_agent._trace", "fsm_agent._trace.io", "fsm_agent._trace"])
