"""Files the command line writes: never over one of its inputs, never half written.

Every command that writes a file goes through :func:`write_output`. It refuses an output
that is one of the command's inputs — the same path, a symbolic link to it, or a hard
link (the same device and inode) — because writing it would destroy the very data the
command read (``runs export R --db runs.db -o runs.db`` once replaced a whole store with
one run's trace). The data goes to a temporary file beside the target, which is renamed
into place only when complete, so a failure or a kill leaves the old file as it was
(a device or a named pipe, such as ``/dev/stdout``, is written to directly).
"""

from __future__ import annotations

import contextlib
import os
import stat
import sys
import tempfile
from collections.abc import Iterable, Sequence

from fsm_agent._errors import UsageError

__all__ = ["Input", "refuse_clobber", "refuse_stdout_clobber", "sqlite_inputs", "write_output"]

#: ``(flag or role, path)`` of a file the command reads, for the refusal's message.
Input = tuple[str, str]


def sqlite_inputs(db: str) -> list[Input]:
    """The files of a SQLite store: the database and the journals SQLite keeps beside
    it (overwriting ``runs.db-wal`` loses committed transactions just as surely)."""
    return [("--db", db)] + [("--db", db + suffix) for suffix in ("-wal", "-shm", "-journal")]


def _identity(path: str) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:  # not there (yet): only its name can collide
        return None
    return st.st_dev, st.st_ino


def refuse_clobber(flag: str, output: str, inputs: Iterable[Input]) -> None:
    """A :class:`UsageError` if ``output`` names one of ``inputs`` (same resolved path,
    or same device and inode: a hard link)."""
    real = os.path.realpath(output)
    ident = _identity(output)
    for role, path in inputs:
        same_name = os.path.realpath(path) == real
        other = _identity(path)
        if same_name or (ident is not None and ident == other):
            how = "is" if os.path.abspath(path) == os.path.abspath(output) else "is a link to"
            raise UsageError(
                f"{flag} {output} {how} the input {role} {path}: writing it would destroy "
                "what is being read; choose another output file"
            )


def refuse_stdout_clobber(inputs: Iterable[Input]) -> None:
    """A :class:`UsageError` if standard output is one of ``inputs`` (``>> runs.db``)."""
    try:
        st = os.fstat(sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):  # no real file behind it (a test's)
        return
    if not stat.S_ISREG(st.st_mode):
        return
    for role, path in inputs:
        if _identity(path) == (st.st_dev, st.st_ino):
            raise UsageError(
                f"standard output is the input {role} {path}: writing to it would destroy "
                "what is being read; redirect to another file or use -o FILE"
            )


def write_output(flag: str, output: str, data: bytes, inputs: Sequence[Input] = ()) -> None:
    """Write ``data`` to ``output`` atomically, refusing an output that is an input.

    ``flag`` names the option that gave ``output`` (``-o``, ``--html``) in messages."""
    refuse_clobber(flag, output, inputs)
    # Rename onto the file a symbolic link points at, so the link stays a link.
    target = os.path.realpath(output)
    try:
        mode = os.stat(target).st_mode
    except OSError:
        mode = None
    if mode is not None and stat.S_ISDIR(mode):
        raise UsageError(f"cannot write {flag} {output}: it is a folder; name a file")
    if mode is not None and not stat.S_ISREG(mode):
        _write_through(flag, output, data)  # /dev/stdout, a named pipe: nothing to rename
        return
    folder = os.path.dirname(target) or "."
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(target)}.", dir=folder)
    except OSError as exc:
        raise UsageError(f"cannot write {flag} {output}: {exc.strerror or exc}") from None
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        _keep_mode(target, tmp)
        os.replace(tmp, target)
    except OSError as exc:
        _remove(tmp)
        raise UsageError(f"cannot write {flag} {output}: {exc.strerror or exc}") from None
    except BaseException:
        _remove(tmp)
        raise


def _write_through(flag: str, output: str, data: bytes) -> None:
    try:
        with open(output, "wb") as handle:
            handle.write(data)
    except OSError as exc:
        raise UsageError(f"cannot write {flag} {output}: {exc.strerror or exc}") from None


def _keep_mode(target: str, tmp: str) -> None:
    """The replaced file keeps its permissions; a new one gets the usual ``0o666 &
    ~umask`` (``mkstemp`` makes it ``0o600``)."""
    try:
        mode = os.stat(target).st_mode & 0o7777
    except FileNotFoundError:
        umask = os.umask(0)
        os.umask(umask)
        mode = 0o666 & ~umask
    os.chmod(tmp, mode)


def _remove(path: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)
