"""The code's habits, enforced: a function longer than 60 lines says why.

ruff limits complexity (C901, 12); length is checked here. A long function is fine where
it is one table, one list of declarations or one hot loop kept flat for speed, and it
says so on its ``def`` line: ``# long: reason`` or ``# noqa: C901 - reason``.
"""

from __future__ import annotations

import ast
from pathlib import Path

import fsm_agent

PACKAGE = Path(fsm_agent.__file__).parent
LIMIT = 60
REASONS = ("# long: ", "# noqa: C901 - ")


def long_functions_without_a_reason(source: str, name: str) -> list[str]:
    lines = source.splitlines()
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        length = (node.end_lineno or node.lineno) - node.lineno + 1
        signature = "\n".join(lines[node.lineno - 1 : node.body[0].lineno - 1])
        if length > LIMIT and not any(reason in signature for reason in REASONS):
            found.append(f"{name}:{node.lineno} {node.name} ({length} lines)")
    return found


def test_every_function_over_60_lines_says_why() -> None:
    found = [
        problem
        for path in sorted(PACKAGE.rglob("*.py"))
        for problem in long_functions_without_a_reason(
            path.read_text(encoding="utf-8"), str(path.relative_to(PACKAGE.parent))
        )
    ]
    assert found == [], "split these, or say why on the def line (# long: reason):\n" + (
        "\n".join(found)
    )


def test_the_check_sees_a_long_function_and_its_reason() -> None:
    body = "".join(f"    x{i} = {i}\n" for i in range(LIMIT))
    assert long_functions_without_a_reason(f"def f() -> None:\n{body}", "m.py") == [
        "m.py:1 f (61 lines)"
    ]
    assert long_functions_without_a_reason(f"def f() -> None:  # long: a table\n{body}", "m") == []
    short = "".join(f"    x{i} = {i}\n" for i in range(LIMIT - 1))
    assert long_functions_without_a_reason(f"def f() -> None:\n{short}", "m.py") == []
