"""The self-contained HTML step-through viewer (``fsm-agent replay TRACE --html``).

One file, no network: the machine's SVG inline, the events as JSON, a little CSS and JS.
The graph is fitted to its pane and can be zoomed (wheel, the +/−/fit buttons, the
``+``, ``-`` and ``0`` keys) and panned (drag, or Shift+arrow keys); the selected event is
shown formatted (calls, guards, results) with the raw JSON below it, and a call id can be
picked to jump to the steps that concern it.

Trace content is untrusted (tool output may contain ``</script>``): it is embedded in a
``<script type="application/json">`` block with ``<``, ``>``, ``&`` and U+2028/U+2029
written as ``\\uXXXX`` escapes, so nothing in it can close the block, and the page only
ever shows it through ``textContent``, never as markup.
"""

from __future__ import annotations

import html
import json
import re
from importlib.resources import files
from typing import Any

from fsm_agent._core.table import INITIAL_STATE
from fsm_agent._render.edges import drawing
from fsm_agent._render.replay import Replay, describe_event
from fsm_agent._render.svg import machine_svg

__all__ = ["json_for_script", "viewer_html"]

_SCRIPT_ESCAPES = str.maketrans(
    {"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028", "\u2029": "\\u2029"}
)


def json_for_script(value: Any) -> str:
    """JSON that is safe inside a ``<script>`` element whatever strings it holds."""
    return json.dumps(value, ensure_ascii=False, default=repr).translate(_SCRIPT_ESCAPES)


def _inline_svg(svg: bytes) -> str:
    text = svg.decode("utf-8")
    text = text[text.index("<svg") :]  # drop the XML prolog and DOCTYPE (a remote DTD URL)
    # The page sizes the picture (fit to the pane) and zooms by its viewBox.
    return re.sub(r'<svg width="[^"]*" height="[^"]*"', '<svg id="machine"', text, count=1)


def _asset(name: str) -> str:
    return files("fsm_agent._render").joinpath(f"viewer/{name}").read_text(encoding="utf-8")


def viewer_html(
    replay: Replay, renderer: str | None = None, start: int = 0, detail: str = "overview"
) -> str:
    """The viewer page for ``replay``, opened at step ``start``, drawing its machine in
    ``detail`` view (``overview`` or ``full``)."""
    machine = replay.machine
    svg = _inline_svg(machine_svg(None, detail, renderer, machine))
    drawn = drawing(machine)
    arrow = drawn.arrow_of if detail == "overview" else drawn.edge_of
    steps = []
    for step in replay.steps:
        t = step.transition
        steps.append(
            {
                "state": step.state,
                "edge": arrow(t).id if t is not None else None,
                "label": f"{t.label} -> {t.dest}" if t is not None else None,
                "rule": t.rule if t is not None else None,
                "summary": describe_event(step.event),
                "failed": replay.failed_attempts(step.index),
                "event": step.event,
            }
        )
    data = {
        "path": replay.path,
        "machine_hash": machine.hash,
        "initial": INITIAL_STATE,
        "start": replay.step(start).index,
        "steps": steps,
    }
    parts = {
        "TITLE": html.escape(f"fsm-agent replay: {replay.path}"),
        "STYLE": _asset("viewer.css"),
        "SVG": svg,
        "DATA": json_for_script(data),
        "SCRIPT": _asset("viewer.js"),
    }
    # One pass, so text substituted for one slot is never searched for another.
    return re.sub(r"\{\{(TITLE|STYLE|SVG|DATA|SCRIPT)\}\}", lambda m: parts[m.group(1)], _PAGE)


_PAGE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta http-equiv="Content-Security-Policy"
      content="default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline';
               img-src data:">
<title>{{TITLE}}</title>
<style>
{{STYLE}}
</style>
</head>
<body>
<header>
  <span class="group" role="group" aria-label="step">
    <button id="first" title="first step (Home)">&#xAB;</button>
    <button id="prev" title="previous step (Left arrow)">&#x25C0;</button>
    <button id="next" title="next step (Right arrow)">&#x25B6;</button>
    <button id="last" title="last step (End)">&#xBB;</button>
  </span>
  <input id="slider" type="range" min="0" value="0" step="1" aria-label="step">
  <span id="position"></span>
  <label class="group">call
    <select id="call" aria-label="jump to a call id"><option value="">(any)</option></select>
    <button id="call-next" title="next step of this call (c)">next &#x25B8;</button>
  </label>
  <span class="group" role="group" aria-label="zoom">
    <button id="zoom-out" title="zoom out (-)">&#x2212;</button>
    <button id="zoom-fit" title="fit the graph to the pane (0)">fit</button>
    <button id="zoom-in" title="zoom in (+)">+</button>
    <span id="zoom-level">100%</span>
  </span>
</header>
<main>
  <div id="graph" tabindex="0" title="wheel to zoom, drag to pan">{{SVG}}</div>
  <div id="details">
    <h2 id="summary"></h2>
    <dl class="facts">
      <dt>state</dt><dd id="state"></dd>
      <dt>edge</dt><dd id="edge"></dd>
      <dt>rule</dt><dd id="rule"></dd>
    </dl>
    <h3>event</h3>
    <div id="event-view"></div>
    <details id="raw"><summary>raw JSON</summary><pre id="event"></pre></details>
    <h3>edges taken so far</h3>
    <ul id="counts"></ul>
  </div>
</main>
<script type="application/json" id="trace-data">{{DATA}}</script>
<script>
{{SCRIPT}}
</script>
</body>
</html>
"""
