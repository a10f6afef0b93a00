"""MkDocs hook: a site that works opened from disk (``site/index.html`` over file://),
and API pages without raw Sphinx roles.

* Pages are files (``use_directory_urls: false`` in ``mkdocs.yml``), so every link names
  an ``.html`` file a browser opens from disk (a directory link shows a listing there).
* Search: the theme reads its index from ``search/search_index.js`` on a file:// page
  (a page opened from disk may not fetch JSON), so this hook writes it next to the JSON;
  ``assets/javascripts/file-worker.js`` runs the theme's search worker where browsers
  refuse a Worker (file://).
* The package's docstrings cross-reference in Sphinx roles (``:class:`~pkg.Name```), which
  mkdocstrings renders as text; each becomes the name as code (``Name`` for ``~pkg.Name``,
  ``name()`` for a function or method), as Sphinx shows them; and a paragraph ending in
  reST's ``::`` before a code block ends in one colon, as Sphinx shows it.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

_ROLE = re.compile(
    r":(?:py:)?(class|meth|func|attr|mod|exc|data|obj|const|ref|term):<code>(~?)([^<]*)</code>"
)
_CALLABLE = {"meth", "func"}


def _plain(match: re.Match[str]) -> str:
    role, short, target = match.groups()
    text = target.rsplit(".", 1)[-1] if short else target
    if role in _CALLABLE and not text.endswith(")"):
        text += "()"
    return f"<code>{text}</code>"


#: reST's literal-block marker: ``text::`` before an indented block shows ``text:``.
_LITERAL = re.compile(r"::</p>(\s*<(?:pre|div class=\"highlight\")>)")


def on_page_content(html: str, **kwargs: Any) -> str:
    return _LITERAL.sub(r":</p>\1", _ROLE.sub(_plain, html))


def on_post_build(config: Any, **kwargs: Any) -> None:
    index = Path(config["site_dir"]) / "search" / "search_index.json"
    if index.is_file():
        text = index.read_text(encoding="utf-8")
        (index.parent / "search_index.js").write_text(f"var __index = {text};\n", "utf-8")
