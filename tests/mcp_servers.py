"""Published MCP servers for the tests, installed from PyPI and npm into build/mcp-servers.

``python tests/mcp_servers.py`` installs them (``make test`` runs it first); it never
fails: a server that cannot be installed is written down with the reason, and its tests
skip with that one reason. Versions are pinned so the tests see the same tools.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import venv
from pathlib import Path

import pytest

ROOT = Path(
    os.environ.get("FSM_AGENT_MCP_SERVERS", Path(__file__).parents[1] / "build" / "mcp-servers")
)
MANIFEST = ROOT / "manifest.json"

#: name -> (how, packages, executable). Python servers get a venv each: their pins differ
#: (mcp-server-sqlite only runs on mcp 1.x).
SERVERS: dict[str, tuple[str, tuple[str, ...], str]] = {
    "time": ("pip", ("mcp-server-time==2026.10.19",), "mcp-server-time"),
    "git": ("pip", ("mcp-server-git==2026.10.19",), "mcp-server-git"),
    "sqlite": ("pip", ("mcp-server-sqlite==2025.4.25", "mcp<2"), "mcp-server-sqlite"),
    "filesystem": (
        "npm",
        ("@modelcontextprotocol/server-filesystem@2026.8.31",),
        "mcp-server-filesystem",
    ),
    "memory": ("npm", ("@modelcontextprotocol/server-memory@2026.8.31",), "mcp-server-memory"),
    "everything": (
        "npm",
        ("@modelcontextprotocol/server-everything@2026.8.31",),
        "mcp-server-everything",
    ),
}


def _run(argv: list[str]) -> str | None:
    """None on success, else the end of what the command said."""
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{argv[0]}: {exc}"
    if done.returncode != 0:
        return (
            f"{' '.join(argv[:3])} exited {done.returncode}: {(done.stderr or done.stdout)[-300:]}"
        )
    return None


def _install_pip(name: str, packages: tuple[str, ...]) -> str | None:
    env_dir = ROOT / f"py-{name}"
    if not (env_dir / "bin" / "python").exists():
        venv.create(env_dir, with_pip=True)
    return _run([str(env_dir / "bin" / "python"), "-m", "pip", "install", "-q", *packages])


def _install_npm(packages: list[str]) -> str | None:
    if shutil.which("npm") is None:
        return "npm is not installed"
    prefix = str(ROOT / "node")
    return _run(
        ["npm", "install", "--prefix", prefix, "--no-audit", "--no-fund", "--silent", *packages]
    )


def install() -> dict[str, str | None]:
    """Install every server not installed yet; the manifest maps name -> failure or None."""
    ROOT.mkdir(parents=True, exist_ok=True)
    wanted = json.dumps(SERVERS, sort_keys=True)
    old = json.loads(MANIFEST.read_text()) if MANIFEST.exists() else {}
    if old.get("wanted") == wanted and not any(old["servers"].values()):
        return dict(old["servers"])
    status: dict[str, str | None] = {}
    for name, (how, packages, _exe) in SERVERS.items():
        if how == "pip":
            status[name] = _install_pip(name, packages)
    npm = [p for how, packages, _ in SERVERS.values() if how == "npm" for p in packages]
    failure = _install_npm(npm)
    for name, (how, _packages, _exe) in SERVERS.items():
        if how == "npm":
            status[name] = failure
    MANIFEST.write_text(json.dumps({"wanted": wanted, "servers": status}, indent=1))
    return status


def executable(name: str) -> str:
    """The installed server's executable, or a skip saying why there is none."""
    how, _packages, exe = SERVERS[name]
    if not MANIFEST.exists():
        pytest.skip(f"MCP server {name} is not installed: run `python tests/mcp_servers.py`")
    failure = json.loads(MANIFEST.read_text())["servers"].get(name)
    if failure:
        pytest.skip(f"MCP server {name} could not be installed: {failure}")
    path = ROOT / (f"py-{name}/bin/{exe}" if how == "pip" else f"node/node_modules/.bin/{exe}")
    if not path.exists():
        pytest.skip(f"MCP server {name} is not installed at {path}")
    return str(path)


if __name__ == "__main__":
    result = install()
    for server, why in result.items():
        print(f"mcp server {server}: {'ok' if why is None else 'NOT INSTALLED: ' + why}")
    sys.exit(0)
