"""The machine as SVG, with each arrow's full guard detail as its ``<title>`` tooltip.

Graphviz titles an edge ``source->dest``; after layout we replace that text with the
arrow's detail (every table row it stands for: priority, trigger, guards, reason, rule)
and a node's with what the state means, so hovering explains the picture in a browser
and on GitHub. Doing it after layout keeps the DOT short (a ``tooltip`` attribute would
wrap every arrow in an ``<a>``) and gives identical text whichever renderer ran.
"""

from __future__ import annotations

import html
import re
from collections.abc import Mapping

from fsm_agent._core.table import DEFAULT_MACHINE, Machine
from fsm_agent._render.dot import STATE_HELP, Overlay, arrows, machine_dot
from fsm_agent._render.engine import Rendered, render

__all__ = ["add_titles", "machine_svg", "titles"]

# Graphviz writes a group as <g id="ID" class="node|edge">, then <title>TEXT</title>.
_GROUP = re.compile(r'(<g id="([^"]*)" class="(?:node|edge)">\s*<title>)(.*?)(</title>)', re.S)


def titles(detail: str, machine: Machine = DEFAULT_MACHINE) -> dict[str, str]:
    """Tooltip text by element id for a view of ``machine``: arrows and states."""
    out = {a.id: a.detail() for a in arrows(detail, machine)}
    out.update({f"state-{state}": f"{state}: {text}" for state, text in STATE_HELP.items()})
    out["edge-start"] = "the initial state"
    return out


def add_titles(svg: bytes, by_id: Mapping[str, str]) -> bytes:
    """``svg`` with the ``<title>`` of every group whose id is in ``by_id`` replaced."""

    def swap(m: re.Match[str]) -> str:
        text = by_id.get(html.unescape(m.group(2)))
        if text is None:
            return m.group(0)
        return m.group(1) + html.escape(text, quote=False) + m.group(4)

    return _GROUP.sub(swap, svg.decode("utf-8")).encode("utf-8")


def machine_svg(
    overlay: Overlay | None = None,
    detail: str = "overview",
    renderer: str | None = None,
    machine: Machine = DEFAULT_MACHINE,
) -> Rendered:
    """``machine`` (and ``overlay``) as SVG in ``detail`` view, with tooltips."""
    drawn = render(machine_dot(overlay, detail, machine), "svg", renderer)
    return Rendered(add_titles(bytes(drawn), titles(detail, machine)), drawn.renderer)
