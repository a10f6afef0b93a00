// fsm-agent replay viewer. Trace content only ever reaches the page as text
// (textContent, createElement), never as markup.
(function () {
  "use strict";
  var data = JSON.parse(document.getElementById("trace-data").textContent);
  var steps = data.steps;
  var slider = document.getElementById("slider");
  var pane = document.getElementById("graph");
  var svg = pane.querySelector("svg");
  var nodes = svg.querySelectorAll("g.node");
  var edges = svg.querySelectorAll("g.edge");
  var callSelect = document.getElementById("call");
  var current = 0;
  slider.max = String(steps.length - 1);

  function byId(id) { return document.getElementById(id); }
  function text(id, value) {
    byId(id).textContent = value == null ? "" : String(value);
  }
  function el(tag, content, cls) {
    var node = document.createElement(tag);
    if (content != null) { node.textContent = String(content); }
    if (cls) { node.className = cls; }
    return node;
  }
  function pretty(value) {
    if (typeof value === "string") {
      try { return JSON.stringify(JSON.parse(value), null, 2); } catch (e) { return value; }
    }
    return JSON.stringify(value, null, 2);
  }

  // ── zoom and pan: the picture is fitted to the pane, then its viewBox moves ──────────
  var base = svg.viewBox.baseVal;
  var home = { x: base.x, y: base.y, w: base.width, h: base.height };
  var view = { x: home.x, y: home.y, w: home.w, h: home.h };
  var MIN_ZOOM = 0.5, MAX_ZOOM = 10;

  function applyView() {
    svg.setAttribute("viewBox", [view.x, view.y, view.w, view.h].join(" "));
    text("zoom-level", Math.round(100 * home.w / view.w) + "%");
  }
  function toSvg(clientX, clientY) {
    var m = svg.getScreenCTM();
    if (!m) { return { x: view.x + view.w / 2, y: view.y + view.h / 2 }; }
    var p = new DOMPoint(clientX, clientY).matrixTransform(m.inverse());
    return { x: p.x, y: p.y };
  }
  function zoom(factor, at) {
    var level = home.w / (view.w / factor);
    if (level < MIN_ZOOM) { factor = view.w / (home.w / MIN_ZOOM); }
    if (level > MAX_ZOOM) { factor = view.w / (home.w / MAX_ZOOM); }
    var c = at || { x: view.x + view.w / 2, y: view.y + view.h / 2 };
    view.x = c.x - (c.x - view.x) / factor;
    view.y = c.y - (c.y - view.y) / factor;
    view.w /= factor;
    view.h /= factor;
    applyView();
  }
  function fit() { view = { x: home.x, y: home.y, w: home.w, h: home.h }; applyView(); }
  function pan(dxFraction, dyFraction) {
    view.x += view.w * dxFraction;
    view.y += view.h * dyFraction;
    applyView();
  }
  pane.addEventListener("wheel", function (e) {
    e.preventDefault();
    zoom(Math.exp(-e.deltaY * 0.0015), toSvg(e.clientX, e.clientY));
  }, { passive: false });
  var drag = null;
  pane.addEventListener("pointerdown", function (e) {
    if (e.button !== 0) { return; }
    drag = { start: toSvg(e.clientX, e.clientY) };
    pane.classList.add("dragging");
    pane.setPointerCapture(e.pointerId);
  });
  pane.addEventListener("pointermove", function (e) {
    if (!drag) { return; }
    var p = toSvg(e.clientX, e.clientY);
    view.x -= p.x - drag.start.x;
    view.y -= p.y - drag.start.y;
    applyView();
  });
  function endDrag() { drag = null; pane.classList.remove("dragging"); }
  pane.addEventListener("pointerup", endDrag);
  pane.addEventListener("pointercancel", endDrag);
  byId("zoom-in").addEventListener("click", function () { zoom(1.25); });
  byId("zoom-out").addEventListener("click", function () { zoom(0.8); });
  byId("zoom-fit").addEventListener("click", fit);

  // ── the selected event, formatted ────────────────────────────────────────────────
  function row(table, key, value, cls) {
    var tr = el("tr");
    tr.appendChild(el("th", key));
    var td = el("td", null, cls);
    if (value instanceof Node) { td.appendChild(value); } else { td.textContent = value; }
    tr.appendChild(td);
    table.appendChild(tr);
  }
  function callLink(id) {
    var b = el("button", id, "call-link");
    b.title = "steps of call " + id;
    b.addEventListener("click", function () { selectCall(id); });
    return b;
  }
  function block(value) { return el("pre", pretty(value)); }

  // Every failed attempt of the step's call so far: why a retry happened, or why it
  // ended in failure, without opening the raw JSON.
  function failures(list) {
    var ul = el("ul", null, "failed-attempts");
    list.forEach(function (f) {
      var text = "#" + f.attempt + " " + f.outcome + (f.error ? ": " + f.error : "");
      ul.appendChild(el("li", text, "failure"));
    });
    return ul;
  }

  // A streamed block as it was produced: its deltas in order, each its own span (the
  // recorded pieces with trace_deltas=True; otherwise only the counts were kept), and a
  // button that plays them back one by one.
  function streamedBlock(b) {
    var cell = el("div", null, "streamed");
    var what = b.kind + " #" + b.index + (b.call_id ? " (" + b.call_id + ")" : "") + ": " +
      b.deltas + " deltas, " + b.chars + " chars";
    cell.appendChild(el("div", what, "streamed-head"));
    if (!Array.isArray(b.pieces)) {
      cell.appendChild(el("div", "deltas coalesced (sha256 " + String(b.sha256).slice(0, 12) +
        "\u2026); record them with trace_deltas=True", "streamed-note"));
      return cell;
    }
    var text = el("div", null, "deltas");
    b.pieces.forEach(function (piece) { text.appendChild(el("span", String(piece), "delta")); });
    cell.appendChild(text);
    var play = el("button", "\u25b6 play", "play-deltas");
    play.title = "show the deltas as they arrived";
    play.addEventListener("click", function () {
      var spans = text.querySelectorAll("span.delta");
      spans.forEach(function (s) { s.classList.add("pending"); });
      var i = 0;
      var timer = setInterval(function () {
        if (i >= spans.length) { clearInterval(timer); return; }
        spans[i].classList.remove("pending");
        i += 1;
      }, 60);
    });
    cell.appendChild(play);
    return cell;
  }

  function formatted(event, failed) {
    var box = el("div");
    var table = el("table", null, "kv");
    box.appendChild(table);
    var kind = event.type;
    if (failed && failed.length) { row(table, "failed attempts", failures(failed)); }
    if (kind === "transition") {
      row(table, "trigger", event.trigger);
      row(table, "move", event.source + " \u2192 " + event.dest);
      if (event.reason) { row(table, "reason", event.reason); }
      if (event.call_id) { row(table, "call", callLink(event.call_id)); }
      if (event.tool) { row(table, "tool", event.tool); }
      if (event.attempt != null) { row(table, "attempt", event.attempt); }
      if (event.outcome) {
        row(table, "outcome", event.outcome, event.outcome === "ok" ? "" : "failure");
      }
      if (event.error) { row(table, "error", event.error, "failure"); }
      if (event.detail) { row(table, "detail", event.detail); }
      var guards = event.guards || {};
      Object.keys(guards).forEach(function (g) {
        var v = guards[g];
        row(table, g, v === true ? "\u2713 true" : v === false ? "\u2717 false" : pretty(v),
            v === true ? "guard-true" : v === false ? "guard-false" : "");
      });
    } else if (kind === "decision") {
      var message = event.message || {};
      var calls = message.tool_calls || [];
      if (!event.message) { row(table, "model", "failed: " + (event.error || "no message")); }
      if (message.content) { row(table, "answer", message.content); }
      calls.forEach(function (c) {
        var fn = c["function"] || {};
        var cell = el("div");
        cell.appendChild(callLink(c.id == null ? "(no id)" : String(c.id)));
        cell.appendChild(el("span", " " + (fn.name || "?")));
        cell.appendChild(block(fn.arguments));
        row(table, "call", cell);
      });
      if (event.usage) { row(table, "usage", block(event.usage)); }
      (Array.isArray(message.streamed) ? message.streamed : []).forEach(function (b) {
        row(table, "streamed", streamedBlock(b));
      });
    } else if (kind === "observation") {
      if (event.call_id) { row(table, "call", callLink(event.call_id)); }
      if (event.tool) { row(table, "tool", event.tool); }
      if (event.synthetic) { row(table, "synthetic", "yes (the call did not run)"); }
      row(table, "result", block(event.result));
    } else if (kind === "run_end") {
      row(table, "stop", event.status + "/" + event.reason);
      if (event.detail) { row(table, "detail", event.detail); }
      if (event.answer) { row(table, "answer", event.answer); }
      if (event.counters) { row(table, "counters", block(event.counters)); }
    } else {
      Object.keys(event).forEach(function (k) {
        if (k === "type" || k === "seq" || k === "t") { return; }
        var v = event[k];
        row(table, k, typeof v === "object" && v !== null ? block(v) : String(v));
      });
    }
    return box;
  }

  // ── steps ────────────────────────────────────────────────────────────────────────
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
    var shown = byId("event-view");
    shown.textContent = "";
    shown.appendChild(formatted(step.event, step.failed));
    text("event", JSON.stringify(step.event, null, 2));
    var list = byId("counts");
    list.textContent = "";
    order.forEach(function (id) {
      list.appendChild(el("li", id.replace(/^edge-/, "") + " \u00d7" + counts[id]));
    });
    current = n;
  }

  // ── jump to a call id ────────────────────────────────────────────────────────────
  function callsOf(event) {
    var ids = [];
    if (event.call_id != null) { ids.push(String(event.call_id)); }
    var message = event.type === "decision" ? event.message : null;
    ((message && message.tool_calls) || []).forEach(function (c) {
      if (c && c.id != null) { ids.push(String(c.id)); }
    });
    return ids;
  }
  var stepsOfCall = {};
  steps.forEach(function (s, n) {
    callsOf(s.event).forEach(function (id) {
      if (!stepsOfCall[id]) {
        stepsOfCall[id] = [];
        var option = el("option", id);
        option.value = id;
        callSelect.appendChild(option);
      }
      if (stepsOfCall[id][stepsOfCall[id].length - 1] !== n) { stepsOfCall[id].push(n); }
    });
  });
  function nextOfCall(id) {
    var list = stepsOfCall[id] || [];
    for (var k = 0; k < list.length; k++) { if (list[k] > current) { return list[k]; } }
    return list.length ? list[0] : current;  // wrap around to the call's first step
  }
  function selectCall(id) {
    if (!stepsOfCall[id]) { return; }
    callSelect.value = id;
    show(nextOfCall(id));
  }
  callSelect.addEventListener("change", function () {
    var list = stepsOfCall[callSelect.value];
    if (list) { show(list[0]); }
  });
  byId("call-next").addEventListener("click", function () {
    if (callSelect.value) { show(nextOfCall(callSelect.value)); }
  });

  slider.addEventListener("input", function () { show(parseInt(slider.value, 10)); });
  byId("first").addEventListener("click", function () { show(0); });
  byId("prev").addEventListener("click", function () { show(current - 1); });
  byId("next").addEventListener("click", function () { show(current + 1); });
  byId("last").addEventListener("click", function () { show(steps.length - 1); });
  document.addEventListener("keydown", function (e) {
    if (e.target === slider || e.target === callSelect) { return; }  // they move themselves
    var k = e.key;
    if (e.shiftKey && k.indexOf("Arrow") === 0) {
      var d = { ArrowLeft: [-0.1, 0], ArrowRight: [0.1, 0], ArrowUp: [0, -0.1],
                ArrowDown: [0, 0.1] }[k];
      pan(d[0], d[1]);
    } else if (k === "ArrowRight" || k === "ArrowDown") { show(current + 1); }
    else if (k === "ArrowLeft" || k === "ArrowUp") { show(current - 1); }
    else if (k === "Home") { show(0); }
    else if (k === "End") { show(steps.length - 1); }
    else if (k === "+" || k === "=") { zoom(1.25); }
    else if (k === "-" || k === "_") { zoom(0.8); }
    else if (k === "0") { fit(); }
    else if (k === "c" && callSelect.value) { show(nextOfCall(callSelect.value)); }
    else { return; }
    e.preventDefault();
  });
  applyView();
  show(data.start);
})();
