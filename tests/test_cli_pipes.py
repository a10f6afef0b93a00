"""The command line in a pipeline: a reader that leaves early (``| head``) ends it quietly."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from fsm_agent import Runtime, ScriptedModel, SqliteStore, ToolRegistry
from fsm_agent._cli import main
from fsm_agent.testing import answer, call, decide


@pytest.fixture
def big_run(tmp_path: Path) -> Path:
    """A stored run whose ``show --json`` is far bigger than a pipe's buffer."""
    tools = ToolRegistry()
    tools.register(
        lambda page: "x" * 200_000,
        name="fetch",
        effect="read",
        schema={"type": "object", "properties": {"page": {"type": "integer"}}},
    )
    path = tmp_path / "runs.db"
    with SqliteStore(path) as store:
        model = ScriptedModel([decide(call("fetch", {"page": 1})), answer("fetched")])
        Runtime(model=model, tools=tools, allowed_tools={"fetch"}, store=store).run(
            "fetch page 1", run_id="big"
        )
    return path


@pytest.mark.parametrize(
    "argv",
    [
        ["runs", "show", "big", "--json", "--events", "50"],
        ["runs", "export", "big"],
        ["runs", "show", "big", "--events", "50"],
    ],
)
def test_a_reader_that_leaves_early_is_not_an_error(big_run: Path, argv: list[str]) -> None:
    """Issue 13: `runs show --json | head` printed "Broken pipe" and exited 2."""
    child = subprocess.Popen(
        [sys.executable, "-m", "fsm_agent", *argv, "--db", str(big_run)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert child.stdout is not None and child.stderr is not None
    assert child.stdout.read(100)  # `head -c 100`
    child.stdout.close()  # ... and the reader is gone
    err = child.stderr.read().decode()
    assert child.wait(timeout=60) == 0, err
    assert err == ""


def test_the_whole_output_still_arrives_when_it_is_read(
    big_run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["runs", "show", "big", "--json", "--db", str(big_run)]) == 0
    assert capsys.readouterr().out.count("x" * 1000) > 100


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    from fsm_agent import __version__

    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0
    assert capsys.readouterr().out == f"fsm-agent {__version__}\n"
