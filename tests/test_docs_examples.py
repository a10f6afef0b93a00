"""Every code block in README.md, CHANGELOG.md, CONTRIBUTING.md and docs/ runs as written.

Blocks run page by page, in order, in a fresh folder per page (so a later block may use
what an earlier one defined or wrote, as a reader would):

- ``python``: executed; the page's blocks share one namespace.
- ``sh``: run by bash (``set -e``) with ``fsm-agent`` on PATH.
- ``json``: parsed.
- a block right after ``<!-- test file: ... -->``: written to ``test_doc.py`` and run by
  pytest (with the fsm-agent plugin); every test must pass.
- a block right after ``<!-- not run: REASON -->``: not run, and its test is skipped with
  REASON; a Python block is still compiled and every ``from fsm_agent... import`` name must
  exist, and every ``fsm-agent`` command line must parse.

Any other block (``text``, a language not listed) must carry one of the markers, so no
block is left unchecked by accident.
"""

from __future__ import annotations

import functools
import importlib
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
import traceback
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [
    ROOT / "README.md",
    ROOT / "CHANGELOG.md",
    ROOT / "CONTRIBUTING.md",
    *sorted(p for p in (ROOT / "docs").rglob("*.md") if "_hooks" not in p.parts),
]
_FENCE = re.compile(r"^```(\S*)[^\n]*\n(.*?)^```\s*$", re.S | re.M)
_MARKER = re.compile(r"<!--\s*(not run|test file)\s*:\s*(.*?)\s*-->\s*$", re.S)


@dataclass(frozen=True)
class Block:
    page: Path
    line: int
    lang: str
    code: str
    marker: str | None  # "not run" | "test file" | None
    reason: str

    @property
    def id(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def blocks_of(page: Path) -> list[Block]:
    text = page.read_text(encoding="utf-8")
    found = []
    for m in _FENCE.finditer(text):
        before = text[: m.start()].rstrip("\n").rsplit("\n", 1)[-1]
        marker = _MARKER.search(before)
        found.append(
            Block(
                page,
                text.count("\n", 0, m.start()) + 1,
                m.group(1).lower(),
                m.group(2),
                marker.group(1) if marker else None,
                marker.group(2) if marker else "",
            )
        )
    return found


ALL = [b for page in PAGES for b in blocks_of(page)]


#: The example application the testing guide's test files import (``support_desk``), as
#: a reader running them from its folder has it.
EXAMPLES = [ROOT / "examples" / "support_desk"]


def _env() -> dict[str, str]:
    bin_dir = str(Path(sys.executable).parent)  # where the installed `fsm-agent` lives
    path = [str(p) for p in EXAMPLES] + [p for p in [os.environ.get("PYTHONPATH")] if p]
    return {
        **os.environ,
        "PATH": bin_dir + os.pathsep + os.environ.get("PATH", ""),
        "PYTHONPATH": os.pathsep.join(path),
        "NO_COLOR": "1",
    }


def _run_python(block: Block, namespace: dict[str, object]) -> None:
    code = compile(block.code, f"{block.id}", "exec")
    exec(code, namespace)


def _run(command: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        command, cwd=cwd, env=_env(), capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, f"exit {done.returncode}\n{done.stdout}\n{done.stderr}"
    return done


def _run_sh(block: Block, cwd: Path) -> None:
    _run(["bash", "-e", "-c", block.code], cwd)


def _run_test_file(block: Block, cwd: Path) -> None:
    (cwd / "test_doc.py").write_text(block.code, encoding="utf-8")
    pytest = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_doc.py"]
    done = _run(pytest, cwd)
    assert re.search(r"\b\d+ passed\b", done.stdout) and "failed" not in done.stdout


@functools.cache
def run_page(page: Path) -> dict[int, str | None]:
    """Run a page's runnable blocks in order; line -> None (passed) or the failure."""
    outcome: dict[int, str | None] = {}
    namespace: dict[str, object] = {"__name__": "__doc_example__"}
    cwd = Path(tempfile.mkdtemp(prefix="fsm-agent-docs-"))
    here = os.getcwd()
    os.chdir(cwd)
    try:
        for block in blocks_of(page):
            if block.marker == "not run":
                continue
            try:
                if block.marker == "test file":
                    _run_test_file(block, cwd)
                elif block.lang == "python":
                    _run_python(block, namespace)
                elif block.lang == "sh":
                    _run_sh(block, cwd)
                elif block.lang == "json":
                    json.loads(block.code)
                else:
                    raise AssertionError(
                        f"```{block.lang} block: mark it <!-- not run: why --> if it is not "
                        "meant to run"
                    )
                outcome[block.line] = None
            except BaseException as exc:
                if isinstance(exc, KeyboardInterrupt):
                    raise
                outcome[block.line] = "".join(traceback.format_exception(exc))[-4000:]
    finally:
        os.chdir(here)
    return outcome


def _check_unrun(block: Block) -> None:
    """What can be checked of a block that is not run."""
    if block.lang == "python":
        compile(block.code, block.id, "exec")
        for module, names in re.findall(
            r"^from (fsm_agent[\w.]*) import \(?([^)]+?)\)?$", block.code, re.M
        ):
            loaded = importlib.import_module(module)
            for name in (n.strip() for n in names.split(",")):
                assert name and hasattr(loaded, name), f"{module}.{name} does not exist"
    if block.lang == "sh":
        from fsm_agent._cli import build_parser

        for line in block.code.splitlines():
            line = line.split("#", 1)[0].strip()
            if line.startswith("fsm-agent "):
                build_parser().parse_args(shlex.split(line)[1:])


@pytest.mark.parametrize("block", ALL, ids=[b.id for b in ALL])
def test_code_block(block: Block) -> None:
    if block.marker == "not run":
        _check_unrun(block)
        pytest.skip(f"not run: {block.reason}")
    failure = run_page(block.page)[block.line]
    assert failure is None, f"{block.id} (```{block.lang}) failed:\n{failure}"


def test_every_page_has_its_blocks_found() -> None:
    """The fence pattern finds every block (an odd count of ``` lines would hide one)."""
    for page in PAGES:
        fences = sum(line.startswith("```") for line in page.read_text("utf-8").splitlines())
        assert fences == 2 * len(blocks_of(page)), page
    assert any(b.page.name == "durable-runs.md" and b.lang == "python" for b in ALL)
