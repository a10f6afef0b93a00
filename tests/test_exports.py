"""The public surface, held in place (in the style of trio's ``test_exports.py``).

The public namespaces are ``PUBLIC`` below; every other module is private, with a leading
underscore in its path, and may change without notice. Each public namespace exports
exactly its ``__all__``: every name resolves, no stray public name leaks from an import,
every exception the package raises can be caught by a public name, and every exported
name is documented somewhere under ``docs/``.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import types
from pathlib import Path

import pytest

import fsm_agent
from fsm_agent import _errors
from fsm_agent._render.surface import PUBLIC, summary, surface_page

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "fsm_agent"

#: Imported by a namespace for its own use (annotations, lazy imports), not exported.
HELPERS = {"annotations", "Any", "TYPE_CHECKING", "importlib"}


def _module_names() -> list[str]:
    names = []
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


@pytest.mark.parametrize("name", PUBLIC)
def test_a_public_namespace_exports_exactly_its_all(name: str) -> None:
    module = importlib.import_module(name)
    exported = list(module.__all__)
    assert len(exported) == len(set(exported)), f"{name}.__all__ names a name twice"
    for attr in exported:
        assert not attr.startswith("_") or attr == "__version__", f"{name} exports {attr}"
        getattr(module, attr)  # resolves (lazy names included)
    stray = sorted(
        attr
        for attr, value in vars(module).items()
        if not attr.startswith("_")
        and attr not in exported
        and attr not in HELPERS
        and not isinstance(value, types.ModuleType)
    )
    assert stray == [], f"{name} has public names outside __all__: {stray}"


def test_every_other_module_is_private() -> None:
    public = set(PUBLIC) | {"fsm_agent.__main__"}
    leaked = [
        module
        for module in _module_names()
        if module not in public and not any(p.startswith("_") for p in module.split(".")[1:])
    ]
    assert leaked == [], f"modules neither public nor private (no underscore): {leaked}"


def test_every_error_the_package_raises_has_a_public_name() -> None:
    errors = {
        cls
        for _, cls in inspect.getmembers(_errors, inspect.isclass)
        if issubclass(cls, fsm_agent.FsmAgentError)
    }
    reachable = {
        value
        for name in PUBLIC
        for value in vars(importlib.import_module(name)).values()
        if inspect.isclass(value)
    }
    assert sorted(c.__name__ for c in errors - reachable) == []


def test_the_surface_page_lists_every_export_and_each_has_a_summary() -> None:
    committed = (ROOT / "docs" / "reference" / "surface.md").read_text(encoding="utf-8")
    assert committed == surface_page(), "docs/reference/surface.md is stale: run make diagrams"
    bare = [
        f"{name}.{attr}"
        for name in PUBLIC
        for attr in importlib.import_module(name).__all__
        if (inspect.isclass(value := getattr(importlib.import_module(name), attr))
            or inspect.isfunction(value))
        and not summary(value)
    ]  # fmt: skip
    assert bare == [], f"public classes and functions without a docstring: {bare}"


def test_the_hand_driving_api_is_pure() -> None:
    """``fsm_agent.sansio`` re-exports only the pure layers (``_core``, ``_rules``), whose
    modules import nothing that talks to the world (``test_layering.py`` holds ``_core``
    to that): a hand-driver gets the loop without a driver, a store or a clock."""
    tree = ast.parse((PACKAGE / "sansio.py").read_text(encoding="utf-8"))
    sources = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    impure = sorted(
        m for m in sources if m and not m.startswith(("fsm_agent._core", "fsm_agent._rules"))
    )
    assert impure == []


@pytest.mark.parametrize(
    "old", ["fsm_agent.core", "fsm_agent.durable.sqlite", "fsm_agent.machine", "fsm_agent.errors"]
)
def test_the_old_module_paths_are_gone(old: str) -> None:
    # No release had them (CHANGELOG.md): no forwarding shim, a plain ImportError.
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module(old)
