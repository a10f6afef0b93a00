"""Documentation generated from the table: the rows that encode each rule.

``docs/concepts/rules.md`` holds one section per rule code (``R1`` … ``R12``, ``D1`` …
``D3``). Between the markers ``<!-- rows:CODE -->`` and ``<!-- /rows -->`` each section
lists the transitions whose ``rule`` cites that code, as a Markdown table generated here
from :data:`~fsm_agent._core.table.TRANSITIONS`; ``<!-- rows:none -->`` lists the rows that
cite no code. ``make diagrams`` rewrites the sections (``python -m fsm_agent._cli.regen``)
and a test fails when the committed page no longer matches the table, so the page cannot
drift from the machine.
"""

from __future__ import annotations

import re

from fsm_agent._core.table import TRANSITIONS, Transition
from fsm_agent._render.edges import detail_line

__all__ = ["RULE_CODE", "codes_of", "rows_table", "update_rule_rows"]

#: A rule code inside a transition's ``rule`` text: ``R1`` … ``R12``, ``D1`` … ``D3``.
RULE_CODE = re.compile(r"\b[RD]\d+\b")

_SECTION = re.compile(r"(<!-- rows:(\w+) -->\n)(.*?)(<!-- /rows -->)", re.S)


def codes_of(t: Transition) -> list[str]:
    """The rule codes a transition cites, in the order written."""
    return RULE_CODE.findall(t.rule)


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def rows_table(code: str | None) -> str:
    """Markdown table of the rows citing ``code`` (``None``: rows citing no code)."""
    rows = [
        t
        for t in TRANSITIONS
        if (code is None and not codes_of(t)) or (code is not None and code in codes_of(t))
    ]
    if not rows:
        return "*No row of the table cites this rule yet.*\n"
    out = ["| # | move and edge | why |", "|---|---|---|"]
    for t in rows:
        index = t.index
        out.append(
            f"| {index} | `{t.source}` → `{t.dest}`<br>`{_cell(detail_line(t))}` "
            f"| {_cell(t.rule)} |"
        )
    return "\n".join(out) + "\n"


def update_rule_rows(text: str) -> str:
    """``text`` with every generated section rewritten from the table."""

    def fill(m: re.Match[str]) -> str:
        code = m.group(2)
        return m.group(1) + rows_table(None if code == "none" else code.upper()) + m.group(4)

    return _SECTION.sub(fill, text)
