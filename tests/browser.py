"""Debian's chromium driven by Playwright, for the tests of what a person looks at.

Never ``playwright install``: the browser is the system's (``.ci/run`` installs it), and
its flags keep it off the network (this machine has none beyond the package registries).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

CHROMIUM = "/usr/bin/chromium"
sync_playwright: Any
try:
    from playwright.sync_api import sync_playwright
except ImportError:  # pragma: no cover - depends on the machine
    sync_playwright = None

ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update",
        "--disable-sync"]  # fmt: skip

#: Skips a test where the browser or Playwright is missing, saying which.
needs_browser = pytest.mark.skipif(
    not Path(CHROMIUM).exists() or sync_playwright is None,
    reason=f"needs {CHROMIUM} (apt-get install chromium) and playwright (pip)",
)


@contextmanager
def chromium() -> Iterator[Any]:
    """A headless chromium, closed on leaving."""
    assert sync_playwright is not None
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            yield browser
        finally:
            browser.close()
