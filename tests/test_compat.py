"""The 0.1 import paths still work for one release, each with a DeprecationWarning that
points at the importing line and names the new home."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

from fsm_agent._compat import MOVED

#: One name each old module exported in 0.1, and where it lives now.
SAMPLES = {
    "fsm_agent.machine": ("TRANSITIONS", "fsm_agent.core.table"),
    "fsm_agent.guards": ("GUARDS", "fsm_agent.core.guards"),
    "fsm_agent.run": ("Counters", "fsm_agent.core.state"),
    "fsm_agent.effects": ("ToolOutcome", "fsm_agent.core.requests"),
    "fsm_agent.reasons": ("stop_detail", "fsm_agent.core.reasons"),
    "fsm_agent.decision": ("parse_decision", "fsm_agent.core.decision"),
    "fsm_agent.canonical": ("digest", "fsm_agent.core.canonical"),
    "fsm_agent.budget": ("Budget", "fsm_agent.core.budget"),
    "fsm_agent.approvals": ("Approval", "fsm_agent.core.approvals"),
    "fsm_agent.history": ("check_history", "fsm_agent.core.history"),
    "fsm_agent.check": ("check_file", "fsm_agent.trace.checker"),
    "fsm_agent.store": ("MemoryStore", "fsm_agent.durable.memory"),
    "fsm_agent.sqlite_store": ("SqliteStore", "fsm_agent.durable.sqlite"),
    "fsm_agent.review": ("record_review", "fsm_agent.durable.review"),
    "fsm_agent.tools_mcp": ("McpToolInfo", "fsm_agent.tools.mcp"),
    "fsm_agent.context": ("time_left", "fsm_agent.runtime.context"),
    "fsm_agent.result": ("RunResult", "fsm_agent.runtime.result"),
    "fsm_agent.cli_check": ("register", "fsm_agent.cli.check"),
    "fsm_agent.runs_cli": ("register", "fsm_agent.cli.runs"),
    "fsm_agent.demo": ("SCENARIOS", "fsm_agent.cli.demo"),
    "fsm_agent.render.cli": ("register", "fsm_agent.cli.diagram"),
    "fsm_agent.render.regen": ("main", "fsm_agent.cli.regen"),
    "fsm_agent.models.cli": ("add_model_arguments", "fsm_agent.cli.model_args"),
}


def test_every_moved_module_has_a_sample() -> None:
    assert set(SAMPLES) == set(MOVED)


@pytest.mark.parametrize("old", sorted(SAMPLES))
def test_an_old_path_still_imports_and_warns_at_the_importing_line(old: str) -> None:
    name, home = SAMPLES[old]
    pytest.importorskip("mcp") if old == "fsm_agent.tools_mcp" else None
    sys.modules.pop(old, None)
    with pytest.warns(DeprecationWarning, match=f"{old} is deprecated") as caught:
        module = importlib.import_module(old)
    assert caught[0].filename == __file__  # the warning points at the caller
    assert getattr(module, name) is getattr(importlib.import_module(home), name)
    with pytest.raises(AttributeError, match="its names moved to"):
        module.no_such_name  # noqa: B018


def test_the_current_paths_do_not_warn() -> None:
    code = "import warnings; warnings.simplefilter('error'); import fsm_agent, fsm_agent.testing"
    subprocess.run([sys.executable, "-c", code], check=True)
