"""The release files: the wheel and sdist build, pass ``twine check``, hold what they
should, and the wheel installed into a fresh venv runs the demo and draws a diagram."""

from __future__ import annotations

import email
import importlib.util
import os
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from fsm_agent import __version__

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("build") is None, reason="needs the `build` package (.[dist])"
)


def run(*argv: str | Path, cwd: Path = ROOT, timeout: float = 600) -> str:
    done = subprocess.run(
        [str(a) for a in argv],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1", "NO_COLOR": "1"},
    )
    assert done.returncode == 0, f"{argv} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    return done.stdout


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    run(sys.executable, "-m", "build", "--outdir", out, ROOT)
    return out


def test_wheel_and_sdist_build_and_pass_twine_check(dist: Path) -> None:
    wheel = dist / f"fsm_agent-{__version__}-py3-none-any.whl"
    sdist = dist / f"fsm_agent-{__version__}.tar.gz"
    assert wheel.is_file() and sdist.is_file(), sorted(p.name for p in dist.iterdir())
    if importlib.util.find_spec("twine") is not None:
        run(sys.executable, "-m", "twine", "check", "--strict", wheel, sdist)


def test_the_wheel_holds_the_package_its_assets_and_the_license(dist: Path) -> None:
    wheel = next(dist.glob("*.whl"))
    names = set(zipfile.ZipFile(wheel).namelist())
    info = f"fsm_agent-{__version__}.dist-info"
    for needed in (
        "fsm_agent/__init__.py",
        "fsm_agent/_version.py",
        "fsm_agent/py.typed",
        "fsm_agent/_core/table.py",
        "fsm_agent/_render/viewer/viewer.js",
        "fsm_agent/_render/viewer/viewer.css",
        "fsm_agent/testing/_plugin.py",
        f"{info}/licenses/LICENSE",
        f"{info}/entry_points.txt",
    ):
        assert needed in names, needed
    assert not any(n.startswith(("tests/", "docs/", "benchmarks/", "scripts/")) for n in names)
    with zipfile.ZipFile(wheel) as z:
        meta = email.message_from_bytes(z.read(f"{info}/METADATA"))
        entry_points = z.read(f"{info}/entry_points.txt").decode()
    assert meta["Version"] == __version__ and meta["License-Expression"] == "MIT"
    assert "fsm-agent = fsm_agent._cli:main" in entry_points
    assert "fsm_agent = fsm_agent.testing._plugin" in entry_points
    extras = set(meta.get_all("Provides-Extra") or [])
    assert {"openai", "anthropic", "mcp", "docs", "dist", "dev"} <= extras
    sdist = next(dist.glob("*.tar.gz"))
    with tarfile.open(sdist) as tar:
        members = {m.name.split("/", 1)[1] for m in tar.getmembers() if "/" in m.name}
    assert {"LICENSE", "README.md", "pyproject.toml", "fsm_agent/_version.py"} <= members


@pytest.mark.skipif(sys.version_info < (3, 11), reason="SVG without dot needs Python 3.11+")
def test_a_fresh_venv_installs_the_wheel_and_runs_the_demo_and_a_diagram(
    dist: Path, tmp_path: Path
) -> None:
    venv = tmp_path / "venv"
    run(sys.executable, "-m", "venv", venv)
    python = venv / "bin" / "python"
    run(python, "-m", "pip", "install", "-q", next(dist.glob("*.whl")), timeout=900)
    cli = venv / "bin" / "fsm-agent"
    assert run(cli, "--version", cwd=tmp_path).strip() == f"fsm-agent {__version__}"
    demo = run(cli, "demo", "--scenario", "happy", cwd=tmp_path)
    assert "1 of 1 scenario(s) behaved as expected" in demo
    # A plain install draws with what it brought (the WebAssembly Graphviz).
    run(cli, "diagram", "--renderer", "wasm", "-o", tmp_path / "machine.svg", cwd=tmp_path)
    svg = (tmp_path / "machine.svg").read_text(encoding="utf-8")
    assert svg.rstrip().endswith("</svg>") and "edge-working-cancel-cancelled" in svg.replace(
        "&#45;", "-"
    )
    # The installed copy is the one that ran, not this checkout.
    where = run(python, "-c", "import fsm_agent; print(fsm_agent.__file__)", cwd=tmp_path)
    assert str(venv) in where
