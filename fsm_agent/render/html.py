"""The self-contained HTML step-through viewer (``fsm-agent replay TRACE --html``).

One file, no network: the machine's SVG inline, the events as JSON, a little CSS and JS.
Trace content is untrusted (tool output may contain ``</script>``): it is embedded in a
``<script type="application/json">`` block with ``<``, ``>``, ``&`` and U+2028/U+2029
written as ``\\uXXXX`` escapes, so nothing in it can close the block, and the page only
ever shows it through ``textContent``, never as markup.
"""

from __future__ import annotations

import html
import json
import re
from typing import Any

from fsm_agent.core.table import INITIAL_STATE, MACHINE_HASH
from fsm_agent.render.dot import machine_dot
from fsm_agent.render.edges import edge_of
from fsm_agent.render.engine import render
from fsm_agent.render.replay import Replay, describe_event

__all__ = ["json_for_script", "viewer_html"]

_SCRIPT_ESCAPES = str.maketrans(
    {"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028", "\u2029": "\\u2029"}
)


def json_for_script(value: Any) -> str:
    """JSON that is safe inside a ``<script>`` element whatever strings it holds."""
    return json.dumps(value, ensure_ascii=False, default=repr).translate(_SCRIPT_ESCAPES)


def _inline_svg(svg: bytes) -> str:
    text = svg.decode("utf-8")
    return text[text.index("<svg") :]  # drop the XML prolog and DOCTYPE (a remote DTD URL)


def viewer_html(replay: Replay, renderer: str | None = None, start: int = 0) -> str:
    """The viewer page for ``replay``, opened at step ``start`` (SVG drawn by :func:`render`)."""
    svg = _inline_svg(render(machine_dot(), "svg", renderer))
    steps = []
    for step in replay.steps:
        t = step.transition
        steps.append(
            {
                "state": step.state,
                "edge": edge_of(t).id if t is not None else None,
                "label": f"{t.label} -> {t.dest}" if t is not None else None,
                "rule": t.rule if t is not None else None,
                "summary": describe_event(step.event),
                "event": step.event,
            }
        )
    data = {
        "path": replay.path,
        "machine_hash": MACHINE_HASH,
        "initial": INITIAL_STATE,
        "start": replay.step(start).index,
        "steps": steps,
    }
    parts = {
        "TITLE": html.escape(f"fsm-agent replay: {replay.path}"),
        "SVG": svg,
        "DATA": json_for_script(data),
    }
    # One pass, so text substituted for one slot is never searched for another.
    return re.sub(r"\{\{(TITLE|SVG|DATA)\}\}", lambda m: parts[m.group(1)], _PAGE)


_PAGE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta http-equiv="Content-Security-Policy"
      content="default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline';
               img-src data:">
<title>{{TITLE}}</title>
<style>
  body { font-family: system-ui, sans-serif; margin: 0; display: flex; flex-direction: column;
         height: 100vh; }
  header { padding: 8px 12px; border-bottom: 1px solid #ddd; display: flex; gap: 8px;
           align-items: center; flex-wrap: wrap; }
  header input[type=range] { flex: 1; min-width: 200px; }
  main { flex: 1; display: flex; min-height: 0; }
  #graph { flex: 3; overflow: auto; padding: 8px; }
  #graph svg { max-width: 100%; height: auto; }
  #details { flex: 2; overflow: auto; border-left: 1px solid #ddd; padding: 8px 12px; }
  #details pre { white-space: pre-wrap; word-break: break-word; background: #f6f8fa;
                 padding: 8px; font-size: 12px; }
  #details dt { font-weight: 600; margin-top: 6px; }
  #details h2 { font-size: 1.1em; }
  .node.unreached, .edge.unreached { opacity: 0.3; }
  .node.visited path, .node.visited polygon { stroke: #1a73e8; }
  .node.current path, .node.current polygon { fill: #fbbc04 !important; stroke: #000;
                                               stroke-width: 3px; }
  .edge.taken path, .edge.taken polygon { stroke: #1a73e8; }
  .edge.taken polygon { fill: #1a73e8; }
  .edge.taken text { fill: #1a73e8; }
  .edge.active path { stroke: #d93025 !important; }
  .edge.active polygon { stroke: #d93025 !important; fill: #d93025 !important; }
  .edge.active text { fill: #d93025 !important; font-weight: bold; }
</style>
</head>
<body>
<header>
  <button id="first" title="first step (Home)">&#xAB;</button>
  <button id="prev" title="previous step (Left arrow)">&#x25C0;</button>
  <button id="next" title="next step (Right arrow)">&#x25B6;</button>
  <button id="last" title="last step (End)">&#xBB;</button>
  <input id="slider" type="range" min="0" value="0" step="1" aria-label="step">
  <span id="position"></span>
</header>
<main>
  <div id="graph">{{SVG}}</div>
  <div id="details">
    <h2 id="summary"></h2>
    <dl>
      <dt>state</dt><dd id="state"></dd>
      <dt>edge</dt><dd id="edge"></dd>
      <dt>rule</dt><dd id="rule"></dd>
      <dt>edges taken so far</dt><dd><ul id="counts"></ul></dd>
    </dl>
    <h3>event</h3>
    <pre id="event"></pre>
  </div>
</main>
<script type="application/json" id="trace-data">{{DATA}}</script>
<script>
(function () {
  "use strict";
  var data = JSON.parse(document.getElementById("trace-data").textContent);
  var steps = data.steps;
  var slider = document.getElementById("slider");
  var svg = document.querySelector("#graph svg");
  var nodes = svg.querySelectorAll("g.node");
  var edges = svg.querySelectorAll("g.edge");
  slider.max = String(steps.length - 1);

  function text(id, value) {  // trace content only ever goes in as text
    document.getElementById(id).textContent = value == null ? "" : String(value);
  }

  function show(n) {
    n = Math.max(0, Math.min(steps.length - 1, n));
    slider.value = String(n);
    var visited = {}, counts = {}, order = [];
    visited["state-" + data.initial] = true;
    for (var i = 0; i <= n; i++) {
      var s = steps[i];
      if (s.edge) {
        visited["state-" + s.state] = true;
        if (!counts[s.edge]) { counts[s.edge] = 0; order.push(s.edge); }
        counts[s.edge] += 1;
      }
    }
    var step = steps[n];
    nodes.forEach(function (g) {
      g.classList.toggle("visited", !!visited[g.id]);
      g.classList.toggle("unreached", !visited[g.id] && g.id !== "state-__start");
      g.classList.toggle("current", g.id === "state-" + step.state);
    });
    var lastEdge = null;
    for (var j = n; j >= 0; j--) { if (steps[j].edge) { lastEdge = steps[j].edge; break; } }
    edges.forEach(function (g) {
      var c = counts[g.id] || 0;
      g.classList.toggle("taken", c > 0);
      g.classList.toggle("unreached", c === 0 && g.id !== "edge-start");
      g.classList.toggle("active", g.id === lastEdge);
      g.querySelectorAll("path").forEach(function (p) {
        p.style.strokeWidth = c > 0 ? String(1.5 + Math.log(1 + c)) + "px" : "";
      });
    });
    text("position", "step " + n + " of " + (steps.length - 1));
    text("summary", step.summary);
    text("state", step.state);
    text("edge", step.label || "(no edge at this step)");
    text("rule", step.rule || "");
    text("event", JSON.stringify(step.event, null, 2));
    var list = document.getElementById("counts");
    list.textContent = "";
    order.forEach(function (id) {
      var li = document.createElement("li");
      li.textContent = id.replace(/^edge-/, "") + " \\u00d7" + counts[id];
      list.appendChild(li);
    });
    current = n;
  }

  var current = 0;
  slider.addEventListener("input", function () { show(parseInt(slider.value, 10)); });
  document.getElementById("first").addEventListener("click", function () { show(0); });
  document.getElementById("prev").addEventListener("click", function () { show(current - 1); });
  document.getElementById("next").addEventListener("click", function () { show(current + 1); });
  document.getElementById("last").addEventListener("click", function () {
    show(steps.length - 1);
  });
  document.addEventListener("keydown", function (e) {
    if (e.target === slider) { return; }  // the slider moves itself on arrow keys
    if (e.key === "ArrowRight" || e.key === "ArrowDown") { show(current + 1); }
    else if (e.key === "ArrowLeft" || e.key === "ArrowUp") { show(current - 1); }
    else if (e.key === "Home") { show(0); }
    else if (e.key === "End") { show(steps.length - 1); }
    else { return; }
    e.preventDefault();
  });
  show(data.start);
})();
</script>
</body>
</html>
"""
