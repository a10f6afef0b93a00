"""What ``fsm-agent demo`` prints for people: a block per scenario and a final table.

Each block says what the scenario does, the path the run took through the machine as a
short line of states (a repeated loop is written once with ``×n``), the stop and why,
and every side-effect check as ✓ or ✗ with the value the backend reported. Where the
terminal cannot show ✓, ✗ and →, plain ASCII is used instead.
"""

from __future__ import annotations

import os
import sys
import textwrap
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from fsm_agent._core.table import INITIAL_STATE
from fsm_agent._runtime.result import RunResult

__all__ = [
    "ScenarioOutcome",
    "final_table",
    "path_line",
    "run_path",
    "scenario_block",
    "where_traces_are",
]


@dataclass
class ScenarioOutcome:
    """What one scenario did: its runs and its checks, as the report shows them."""

    name: str
    results: list[RunResult]
    checks: dict[str, tuple[Any, Any]]  # name -> (expected, actual)
    #: What a reader should know happened after the first run (a follow-up), if anything.
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(expected == actual for expected, actual in self.checks.values())


class _Described(Protocol):
    """What a block says of its scenario (``cli.demo.Scenario`` has these)."""

    @property
    def name(self) -> str: ...
    @property
    def description(self) -> str: ...
    @property
    def task(self) -> str: ...


_WIDTH = 100


def _symbols() -> dict[str, str]:
    encoding = getattr(sys.stdout, "encoding", None) or "ascii"
    try:
        "✓✗→×·".encode(encoding)
    except (UnicodeEncodeError, LookupError):
        return {"ok": "ok", "bad": "FAIL", "arrow": "->", "times": "x", "dot": "-"}
    return {"ok": "✓", "bad": "✗", "arrow": "→", "times": "×", "dot": "·"}


def _paint(text: str, colour: str) -> str:
    """Green or red on a terminal that wants colour (https://no-color.org), else plain."""
    if os.environ.get("NO_COLOR") or not sys.stdout.isatty():
        return text
    code = {"green": "32", "red": "31", "bold": "1"}[colour]
    return f"\x1b[{code}m{text}\x1b[0m"


def run_path(result: RunResult) -> list[str]:
    """The states a run went through, in order; a self-loop (a call being dispatched in
    ``executing``) adds nothing a reader needs, so consecutive repeats are one."""
    states: list[str] = [INITIAL_STATE]
    for event in result.events:
        if event.get("type") == "transition" and event.get("dest") != states[-1]:
            states.append(str(event.get("dest")))
    return states


def path_line(states: Sequence[str], arrow: str = "→", times: str = "×") -> str:
    """``a → (b → c) ×2 → d``: the states, a block repeated back to back written once."""
    parts: list[str] = []
    i = 0
    while i < len(states):
        best_len, best_reps = 1, 1
        for size in range(2, (len(states) - i) // 2 + 1):
            reps = 1
            block = list(states[i : i + size])
            while list(states[i + reps * size : i + (reps + 1) * size]) == block:
                reps += 1
            if reps > 1 and size * reps > best_len * best_reps:
                best_len, best_reps = size, reps
        if best_reps > 1:
            loop = f" {arrow} ".join(states[i : i + best_len])
            parts.append(f"({loop}) {times}{best_reps}")
            i += best_len * best_reps
        else:
            parts.append(states[i])
            i += 1
    return f" {arrow} ".join(parts)


def _check_text(name: str, expected: Any, actual: Any, sym: Mapping[str, str]) -> str:
    label = name.replace("_", " ")
    if expected == actual:
        return _paint(sym["ok"], "green") + f" {label} = {actual}"
    return _paint(sym["bad"], "red") + f" {label} = {actual} (expected {expected})"


def _items(label: str, items: Sequence[str], indent: int = 11, gap: str = "   ") -> list[str]:
    """Items on as few lines as fit, never breaking inside one (ANSI colour codes take no
    columns on screen, so widths count only the visible text)."""
    lines: list[str] = []
    line, width = f"  {label + ':':<{indent - 2}}", indent
    for item in items:
        visible = len(item) - (9 if "\x1b[" in item else 0)
        if width > indent and width + len(gap) + visible > _WIDTH:
            lines.append(line)
            line, width = " " * indent, indent
        elif width > indent:
            line, width = line + gap, width + len(gap)
        line, width = line + item, width + visible
    lines.append(line)
    return lines


def _field(label: str, text: str, indent: int = 11) -> list[str]:
    return textwrap.wrap(
        text,
        _WIDTH,
        initial_indent=f"  {label + ':':<{indent - 2}}",
        subsequent_indent=" " * indent,
        break_on_hyphens=False,
    ) or [f"  {label}:"]


def scenario_block(scenario: _Described, outcome: ScenarioOutcome, *, scripted: bool) -> str:
    """The readable report of one scenario (see the module docstring)."""
    sym = _symbols()
    first = outcome.results[0]
    verdict = (
        _paint(sym["ok"] + " as expected", "green")
        if outcome.ok
        else _paint(sym["bad"] + " NOT as expected", "red")
    )
    lines = textwrap.wrap(
        f"{scenario.name} {sym['dot']} {scenario.description}",
        _WIDTH,
        subsequent_indent="  ",
        break_on_hyphens=False,
    )
    lines[0] = _paint(scenario.name, "bold") + lines[0][len(scenario.name) :]
    lines += _field("task", scenario.task)
    lines += _field("path", path_line(run_path(first), sym["arrow"], sym["times"]))
    status, reason = outcome.checks["status"][0], outcome.checks["reason"][0]
    stop = f"{first.status}/{first.reason}"
    stop_ok = (first.status, first.reason) == (status, reason)
    mark = _paint(sym["ok"], "green") if stop_ok else _paint(sym["bad"], "red")
    lines += _field("stop", f"{stop}  {mark}" + ("" if stop_ok else f" expected {status}/{reason}"))
    if first.answer:
        lines += _field("answer", first.answer)
    elif first.detail:
        lines += _field("why", first.detail)
    checks = [
        _check_text(k, e, a, sym)
        for k, (e, a) in outcome.checks.items()
        if k not in ("status", "reason")
    ]
    if checks:
        lines += _items("checks", checks)
    elif not scripted:
        lines += _field("checks", "only the stop (a real model's tool use is its own business)")
    for note in outcome.notes:
        lines += _field("then", note)
    lines.append(f"  {verdict}")
    return "\n".join(lines) + "\n"


def final_table(outcomes: Sequence[ScenarioOutcome]) -> str:
    """One row per scenario: its stop, how many checks held, and the verdict."""
    sym = _symbols()
    rows = [("scenario", "stop", "checks", "")]
    for outcome in outcomes:
        first = outcome.results[0]
        held = sum(e == a for e, a in outcome.checks.values())
        mark = _paint(sym["ok"], "green") if outcome.ok else _paint(sym["bad"], "red")
        rows.append(
            (outcome.name, f"{first.status}/{first.reason}", f"{held}/{len(outcome.checks)}", mark)
        )
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    out = []
    for r in rows:
        out.append("  ".join(cell.ljust(w) for cell, w in zip(r[:3], widths, strict=True)) + r[3])
    good = sum(o.ok for o in outcomes)
    out.append(f"{good} of {len(outcomes)} scenario(s) behaved as expected")
    return "\n".join(out)


def where_traces_are(folder: Path, names: Sequence[str]) -> str:
    """The next commands worth typing, with the traces just written."""
    example = "retry" if "retry" in names else names[0]
    trace = folder / f"{example}.jsonl"
    return (
        f"\ntraces: {folder}/<scenario>.jsonl   try:\n"
        f"  fsm-agent replay {trace}                  # step through it\n"
        f"  fsm-agent replay {trace} --html {folder / example}.html   # in a browser\n"
        f"  fsm-agent check {folder}/*.jsonl"
    )
