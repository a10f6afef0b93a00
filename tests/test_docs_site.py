"""The documentation site as a reader gets it (issue 23 item 9): built by MkDocs like
``make docs``, then opened from disk (``site/index.html`` over file://) in a real browser
(Debian's chromium driven by Playwright, as ``tests/test_viewer_browser.py`` does).

It used to work only behind a web server: every nav link named a folder (a directory
listing from disk) and search never answered. The built pages must also show no raw
Sphinx roles, and render the getting-started scenario table as a table.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import pytest
from browser import chromium, needs_browser

ROOT = Path(__file__).resolve().parents[1]
needs_mkdocs = pytest.mark.skipif(
    __import__("importlib.util").util.find_spec("mkdocs") is None,
    reason="mkdocs is not installed (pip install -e '.[docs]')",
)
#: A role as mkdocstrings renders it (``:class:`x``` -> ``:class:<code>x</code>``) or as
#: it would leak in text.
RAW_ROLE = re.compile(r":(?:py:)?(?:class|meth|func|attr|mod|exc|data|obj|const):(?:<code>|`)")


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    built = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert built.returncode == 0, built.stderr
    return out


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with chromium() as b:
        yield b


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    tab = browser.new_page(viewport={"width": 1280, "height": 900})
    tab.requests = []
    tab.on("request", lambda r: tab.requests.append(r.url))
    yield tab
    tab.close()


class _Links(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.hrefs: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        # links, and what a page loads (pictures, scripts, style sheets)
        wanted = {"a": "href", "link": "href", "img": "src", "script": "src"}.get(tag)
        self.hrefs.extend(v for k, v in attrs if k == wanted and v)


# ── opened from disk, in a browser ───────────────────────────────────────────────────


@needs_mkdocs
@needs_browser
def test_a_nav_link_opened_from_disk_shows_its_page(site: Path, page: Any) -> None:
    page.goto((site / "index.html").as_uri())
    page.locator('nav a.md-nav__link[href="getting-started.html"]').first.click()
    page.wait_for_load_state()
    assert page.url == (site / "getting-started.html").as_uri()
    assert page.locator("h1").first.inner_text().startswith("Getting started")
    # one level down and back up: links are relative to each page's own folder
    page.locator('nav a.md-nav__link[href="concepts/durable-runs.html"]').first.click()
    page.wait_for_load_state()
    assert page.locator("h1").first.inner_text().startswith("Durable runs")
    page.locator('nav a.md-nav__link[href="../reference/api.html"]').first.click()
    page.wait_for_load_state()
    assert page.locator("h1").first.inner_text().startswith("Python API")
    assert page.locator(
        "h2#fsm_agent.KeyedScriptedModel, [id='fsm_agent.KeyedScriptedModel']"
    ).count()
    assert [u for u in page.requests if not u.startswith("file://")] == []  # nothing online


@needs_mkdocs
@needs_browser
def test_search_answers_on_a_site_opened_from_disk(site: Path, page: Any) -> None:
    page.goto((site / "guides" / "review.html").as_uri())
    page.click("input.md-search__input")
    page.keyboard.type("idempotency")
    page.wait_for_selector(".md-search-result__item", timeout=15_000)
    assert re.match(
        r"\d+ matching documents?", page.locator(".md-search-result__meta").inner_text()
    )
    page.locator(".md-search-result__item a").first.click()
    page.wait_for_load_state()
    assert page.url.startswith((site / "x").as_uri()[:-1]) and ".html" in page.url
    assert [u for u in page.requests if not u.startswith("file://")] == []


# ── the built files ──────────────────────────────────────────────────────────────────


@needs_mkdocs
def test_every_link_of_every_page_names_a_file_of_the_site(site: Path) -> None:
    broken: list[str] = []
    for html in site.rglob("*.html"):
        if html.name == "404.html":
            continue  # what a web server answers for a missing page, from the site's root
        links = _Links()
        links.feed(html.read_text(encoding="utf-8"))
        for href in links.hrefs:
            parts = urlsplit(href)
            if parts.scheme or parts.netloc or not parts.path:
                continue  # another site, or an anchor of this page
            target = (html.parent / unquote(parts.path)).resolve()
            if not target.is_file():
                broken.append(f"{html.relative_to(site)}: {href}")
    assert broken == [], "\n".join(broken)


@needs_mkdocs
def test_the_getting_started_scenario_table_is_a_table(site: Path) -> None:
    page = (site / "getting-started.html").read_text(encoding="utf-8")
    tables = re.findall(r"<table>.*?</table>", page, re.S)
    (scenarios,) = [t for t in tables if "expected stop" in t]
    assert scenarios.count("<tr>") == 8  # the header and seven scenarios
    assert "| scenario |" not in page


@needs_mkdocs
def test_no_raw_sphinx_role_reaches_a_reader(site: Path) -> None:
    found = [
        f"{path.relative_to(site)}: {m.group(0)}"
        for path in [*site.rglob("*.html"), site / "search" / "search_index.json"]
        for m in RAW_ROLE.finditer(path.read_text(encoding="utf-8"))
    ]
    assert found == []
    api = (site / "reference" / "api.html").read_text(encoding="utf-8")
    assert "<code>ConfigError</code>" in api  # :class:`~fsm_agent._errors.ConfigError`
    assert "<code>resume()</code>" in api  # :meth:`resume`
    # reST's "text::" before a literal block reads "text:"
    assert "::</p>" not in api and "before any result:</p>" in api


# ── citations ────────────────────────────────────────────────────────────────────────

#: A citation of the product spec, which lives outside the repository.
SPEC = re.compile(r"\bSPEC(?:\.md|\s*§|\s+rule\b|\s+says\b)")


def test_no_file_of_the_repository_cites_a_spec_it_does_not_contain() -> None:
    listed = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True, timeout=60
    ).stdout.decode()
    citing: list[str] = []
    for name in filter(None, listed.split("\0")):
        path = ROOT / name
        if path.suffix not in {".py", ".md", ".toml", ".yml", ".txt", ".cfg"} or not path.is_file():
            continue
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if SPEC.search(line):
                citing.append(f"{name}:{n}: {line.strip()}")
    assert citing == [], "cite the docs/ page instead:\n" + "\n".join(citing)
