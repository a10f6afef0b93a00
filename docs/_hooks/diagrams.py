"""MkDocs hook: publish the committed pictures of ``diagrams/`` and the project's own
CHANGELOG and CONTRIBUTING with the site, so pages link them without keeping copies.

``diagrams/NAME.svg`` is served as ``diagrams/NAME.svg`` (a page in ``concepts/`` links
``../diagrams/run_machine.svg``); ``CHANGELOG.md`` and ``CONTRIBUTING.md`` at the
repository root become the pages ``changelog.md`` and ``contributing.md``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parents[2]
PAGES = {"changelog.md": "CHANGELOG.md", "contributing.md": "CONTRIBUTING.md"}


def on_files(files: Files, config: Any) -> Files:
    for picture in sorted((ROOT / "diagrams").glob("*.svg")):
        files.append(File.generated(config, f"diagrams/{picture.name}", abs_src_path=str(picture)))
    for page, source in PAGES.items():
        text = (ROOT / source).read_text(encoding="utf-8")
        # Links written for the repository (docs/...) point into the site instead.
        text = text.replace("](docs/", "](")
        files.append(File.generated(config, page, content=text))
    return files
