"""The run machine as a Mermaid ``stateDiagram-v2`` (renders on GitHub, needs no Graphviz)."""

from __future__ import annotations

from fsm_agent._core.table import (
    DEFAULT_MACHINE,
    INITIAL_STATE,
    TERMINAL_STATES,
    WORKING_STATES,
    Machine,
)
from fsm_agent._render.edges import WORKING, drawing

__all__ = ["machine_mermaid"]


_ESCAPES = str.maketrans({"#": "#35;", ";": "#59;"})


def _text(line: str) -> str:
    # Mermaid ends a label at ';' and reads '#'-entities; keep labels literal.
    return line.translate(_ESCAPES)


def machine_mermaid(detail: str = "full", machine: Machine = DEFAULT_MACHINE) -> str:
    """Mermaid source of ``machine``: same states, arrows and labels as the DOT diagram of
    ``detail`` (``"full"`` or ``"overview"``, where the working states are one composite
    state)."""
    name = "run machine" if machine.name == "run machine" else f"machine {machine.name}"
    drawn = drawing(machine)
    out = [
        "---",
        f"title: fsm-agent {_text(name)} {machine.hash}",
        "---",
        "stateDiagram-v2",
        f"    [*] --> {INITIAL_STATE}",
    ]
    if detail == "overview":
        out.append(f'    state "working states" as {WORKING} {{')
        out += [f"        {state}" for state in WORKING_STATES]
        out.append("    }")
        for arrow in drawn.arrows:
            label = "<br/>".join(_text(line) for line in arrow.lines())
            out.append(f"    {arrow.source} --> {arrow.dest} : {label}")
    else:
        for edge in drawn.edges:
            label = "<br/>".join(_text(line) for line in edge.lines())
            out.append(f"    {edge.source} --> {edge.dest} : {label}")
    for state in TERMINAL_STATES:
        out.append(f"    {state} --> [*]")
    out.append("    classDef working fill:#e8f0fe,stroke:#1a73e8")
    out.append("    classDef terminal fill:#fdecea,stroke:#d93025,stroke-width:3px")
    out.append(f"    class {','.join(WORKING_STATES)} working")
    out.append(f"    class {','.join(TERMINAL_STATES)} terminal")
    return "\n".join(out) + "\n"
