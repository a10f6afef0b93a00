"""Old import paths of the 0.1 flat layout, kept for one release.

``import fsm_agent.machine`` (and the other flat modules of 0.1) still works: a finder on
``sys.meta_path`` answers each old name with a small module that forwards attribute
lookups to the modules that now hold those names, and warns with a
:class:`DeprecationWarning` naming the new path. Nothing is loaded until an old path is
imported. Remove in 0.3.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import os
import sys
import types
import warnings
from collections.abc import Sequence
from typing import Any

__all__ = ["MOVED", "install"]

#: old module -> the modules that now hold its public names, searched in order.
MOVED: dict[str, tuple[str, ...]] = {
    "fsm_agent.machine": ("fsm_agent.core.table", "fsm_agent.core.engine"),
    "fsm_agent.guards": ("fsm_agent.core.guards",),
    "fsm_agent.run": ("fsm_agent.core.loop", "fsm_agent.core.state"),
    "fsm_agent.effects": ("fsm_agent.core.requests",),
    "fsm_agent.reasons": ("fsm_agent.core.reasons",),
    "fsm_agent.decision": ("fsm_agent.core.decision",),
    "fsm_agent.canonical": ("fsm_agent.core.canonical",),
    "fsm_agent.budget": ("fsm_agent.core.budget",),
    "fsm_agent.approvals": ("fsm_agent.core.approvals",),
    "fsm_agent.history": ("fsm_agent.core.history",),
    "fsm_agent.check": ("fsm_agent.trace.checker",),
    "fsm_agent.store": ("fsm_agent.durable.store", "fsm_agent.durable.memory", "fsm_agent.errors"),
    "fsm_agent.sqlite_store": ("fsm_agent.durable.sqlite",),
    "fsm_agent.review": ("fsm_agent.durable.review",),
    "fsm_agent.tools_mcp": ("fsm_agent.tools.mcp",),
    "fsm_agent.context": ("fsm_agent.runtime.context",),
    "fsm_agent.result": ("fsm_agent.runtime.result",),
    "fsm_agent.cli_check": ("fsm_agent.cli.check",),
    "fsm_agent.runs_cli": ("fsm_agent.cli.runs",),
    "fsm_agent.demo": ("fsm_agent.cli.demo",),
    "fsm_agent.render.cli": ("fsm_agent.cli.diagram",),
    "fsm_agent.render.regen": ("fsm_agent.cli.regen",),
    "fsm_agent.models.cli": ("fsm_agent.cli.model_args",),
}


def _caller_stacklevel() -> int:
    """The ``stacklevel`` that points a warning from ``exec_module`` at the importing
    line. ``warnings`` does not count the import machinery's own frames (it skips
    ``importlib._bootstrap`` frames), so neither does this."""
    frame = sys._getframe(2)  # the caller of exec_module
    level = 2
    while frame is not None:
        name = frame.f_code.co_filename
        bootstrap = "importlib" in name and "_bootstrap" in name
        machinery = bootstrap or f"{os.sep}importlib{os.sep}" in name or name == __file__
        if not machinery:
            return level
        if not bootstrap:
            level += 1
        frame = frame.f_back  # type: ignore[assignment]
    return 2


class _Forwarder:
    """A loader (duck-typed: ``importlib.abc`` costs milliseconds to import)."""

    def __init__(self, targets: tuple[str, ...]) -> None:
        self.targets = targets

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        return types.ModuleType(spec.name)

    def exec_module(self, module: types.ModuleType) -> None:
        targets = self.targets
        warnings.warn(
            f"{module.__name__} is deprecated; import from {targets[0]} (or from "
            "fsm_agent) instead. The old path goes away in 0.3.",
            DeprecationWarning,
            stacklevel=_caller_stacklevel(),
        )

        def forward(name: str) -> Any:
            for target in targets:
                found = importlib.import_module(target)
                if hasattr(found, name):
                    return getattr(found, name)
            raise AttributeError(
                f"module {module.__name__!r} has no attribute {name!r} "
                f"(its names moved to {', '.join(targets)})"
            )

        def names() -> list[str]:
            out: set[str] = set()
            for target in targets:
                out.update(dir(importlib.import_module(target)))
            return sorted(out)

        module.__getattr__ = forward  # type: ignore[method-assign]
        module.__dir__ = names  # type: ignore[method-assign]


class _OldPaths:
    """A meta path finder for the old names (duck-typed, as above)."""

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None = None,
        target: types.ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        targets = MOVED.get(fullname)
        if targets is None:
            return None
        return importlib.machinery.ModuleSpec(fullname, _Forwarder(targets))  # type: ignore[arg-type]


def install() -> None:
    """Put the finder on ``sys.meta_path`` once (``fsm_agent/__init__`` calls this)."""
    if not any(isinstance(f, _OldPaths) for f in sys.meta_path):
        sys.meta_path.append(_OldPaths())
