"""Take the screenshots of ``docs/assets/``: ``python scripts/screenshots.py OUT_DIR``.

- ``readme-picture.png``: the README's picture (``diagrams/run_machine.svg``) shown 900 px
  wide, the width a README is read at;
- ``viewer.png``: the replay viewer of the demo's retry scenario at its default zoom, in a
  1280x800 window;
- ``demo.png``: ``fsm-agent demo``'s output, set in a terminal-like page.

Headless Debian chromium driven by the pip ``playwright`` package (never a downloaded
browser). ``make screenshots`` runs this; look at the files before committing them.
"""

from __future__ import annotations

import html
import subprocess
import sys
import tempfile
from pathlib import Path

from playwright.sync_api import sync_playwright

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars"]


def fsm_agent(*argv: str, cwd: Path) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "fsm_agent", *argv],
        cwd=cwd,
        capture_output=True,
        text=True,
        check=True,
        env={"NO_COLOR": "1", "PATH": "/usr/bin:/bin", "PYTHONIOENCODING": "utf-8"},
    )
    return done.stdout


def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as scratch, sync_playwright() as p:
        work = Path(scratch)
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)

        picture = (ROOT / "diagrams" / "run_machine.svg").as_uri()
        frame = work / "picture.html"  # a file page may show a file image; about:blank may not
        frame.write_text(
            f'<body style="margin:0;background:#fff"><img src="{picture}" style="width:900px">',
            encoding="utf-8",
        )
        page = browser.new_page(viewport={"width": 900, "height": 600})
        page.goto(frame.as_uri())
        page.screenshot(path=str(out / "readme-picture.png"), full_page=True)

        demo = fsm_agent("demo", "--trace-dir", "traces", cwd=work)
        fsm_agent("replay", "traces/retry.jsonl", "--html", "retry.html", "--step", "8", cwd=work)
        page = browser.new_page(viewport={"width": 1280, "height": 800})
        page.goto((work / "retry.html").as_uri())
        page.screenshot(path=str(out / "viewer.png"))

        blocks = demo.split("\n\nscenario ")[0].split("\n\n")
        # Three blocks a reader recognises (a plain run, a retry, a lost write), the table.
        shown = [b for b in blocks if b.split(" ", 1)[0] in ("happy", "retry", "lost_write")]
        table = "scenario " + demo.split("\n\nscenario ", 1)[1].split("\n\ntraces:")[0]
        text = html.escape("$ fsm-agent demo\n" + "\n\n".join(shown) + "\n…\n\n" + table)
        page = browser.new_page(viewport={"width": 900, "height": 400})
        page.set_content(
            '<body style="margin:0;background:#1e1e1e"><pre style="margin:0;padding:14px 16px;'
            "color:#e8e8e8;font:14px/1.35 'DejaVu Sans Mono',monospace;white-space:pre\">"
            f"{text}</pre>"
        )
        page.screenshot(path=str(out / "demo.png"), full_page=True)
        browser.close()
    for name in ("readme-picture.png", "viewer.png", "demo.png"):
        print(out / name)


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "docs" / "assets")
