"""The "Real providers" guide's code compiles, names only real things, and its demo command
lines parse (docs/guides/providers.md; its blocks need API keys, so they are not run)."""

from __future__ import annotations

import importlib
import re
import shlex
from pathlib import Path

import pytest

from fsm_agent._cli import build_parser

SECTION = (Path(__file__).parents[1] / "docs" / "guides" / "providers.md").read_text(
    encoding="utf-8"
)


def blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", SECTION, re.S)


@pytest.mark.parametrize("index", range(1))
def test_python_examples_compile_and_import_real_names(index: int) -> None:
    code = blocks("python")[index]
    compile(code, "README.md", "exec")
    for module, names in re.findall(r"^from (fsm_agent[\w.]*) import (.+)$", code, re.M):
        loaded = importlib.import_module(module)
        for name in names.split(","):
            assert hasattr(loaded, name.strip()), f"{module}.{name.strip()}"


def test_demo_command_lines_parse() -> None:
    lines = [line for line in blocks("sh")[0].splitlines() if line.startswith("fsm-agent ")]
    assert len(lines) == 3
    for line in lines:
        args = build_parser().parse_args(shlex.split(line)[1:])
        assert args.model in ("openai-compatible", "anthropic", "openai-responses")
