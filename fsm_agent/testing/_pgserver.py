"""A PostgreSQL server for tests and benchmarks: the one named by ``FSM_AGENT_PG_DSN``, or
a throwaway cluster started from the installed binaries (``initdb``/``pg_ctl``) on a Unix
socket in a temporary directory, deleted when stopped.

PostgreSQL refuses to run as root: when this process is root (CI, containers) the cluster
belongs to the ``postgres`` system user that Debian's package creates, and its commands
run as that user.

    with pg_server() as server:          # or: server = Server.start(); ...; server.stop()
        store = PostgresStore(server.dsn)
        server.restart()                  # a throwaway cluster only
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import subprocess
import tempfile
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

__all__ = ["ENV", "Server", "find_binaries", "pg_server", "unavailable"]

#: The environment variable naming an existing server to use instead.
ENV = "FSM_AGENT_PG_DSN"

#: Test settings: durability off (a throwaway cluster), room for a fleet of workers.
FAST = ("-c fsync=off", "-c synchronous_commit=off", "-c full_page_writes=off")


def find_binaries() -> Path | None:
    """The directory of ``initdb`` and ``pg_ctl``: on the PATH, else Debian's
    ``/usr/lib/postgresql/<version>/bin`` (the newest)."""
    initdb = shutil.which("initdb")
    if initdb and shutil.which("pg_ctl"):
        return Path(os.path.realpath(initdb)).parent
    found = sorted(
        glob.glob("/usr/lib/postgresql/*/bin/initdb"),
        key=lambda p: int(Path(p).parts[-3]) if Path(p).parts[-3].isdigit() else 0,
    )
    return Path(found[-1]).parent if found else None


def unavailable(*, own: bool = False) -> str | None:
    """Why no server can be had here (``None`` if one can); with ``own``, why no
    throwaway cluster can be started."""
    if os.environ.get(ENV) and not own:
        return None
    if find_binaries() is None:
        return (
            f"no PostgreSQL: set {ENV} to a server's DSN, or install Debian's postgresql "
            "package (initdb, pg_ctl)"
        )
    if os.geteuid() == 0:
        try:
            import pwd

            pwd.getpwnam("postgres")
        except KeyError:
            return "running as root and there is no 'postgres' user to own a throwaway cluster"
    return None


class Server:
    """A running server: :attr:`dsn`; :meth:`restart` and :meth:`stop` for a throwaway one."""

    def __init__(self, dsn: str, directory: Path | None = None, bin_dir: Path | None = None):
        self.dsn = dsn
        self.directory = directory
        self.bin_dir = bin_dir
        self.settings: tuple[str, ...] = ()

    @property
    def throwaway(self) -> bool:
        return self.directory is not None

    @classmethod
    def start(
        cls, settings: tuple[str, ...] = FAST, max_connections: int = 200, *, own: bool = False
    ) -> Server:
        """The server named by ``FSM_AGENT_PG_DSN``, else a new throwaway cluster (with
        ``own``, a throwaway cluster whenever the binaries are here: one to restart)."""
        dsn = os.environ.get(ENV)
        if dsn and not (own and find_binaries() is not None):
            return cls(dsn)
        reason = unavailable()
        if reason:
            raise RuntimeError(reason)
        bin_dir = find_binaries()
        assert bin_dir is not None
        directory = Path(tempfile.mkdtemp(prefix="fsm-agent-pg-"))
        socket_dir = urllib.parse.quote(str(directory), safe="")
        server = cls(f"postgresql://postgres@/postgres?host={socket_dir}", directory, bin_dir)
        server.settings = (*settings, f"-c max_connections={max_connections}")
        if os.geteuid() == 0:
            shutil.chown(directory, "postgres", "postgres")
        server._run("initdb", "-D", str(directory / "data"), "-A", "trust", "-U", "postgres",
                    "-E", "UTF8", "--no-sync", "--locale=C")  # fmt: skip
        try:
            server._pg_ctl("start")
        except BaseException:
            shutil.rmtree(directory, ignore_errors=True)
            raise
        return server

    def _run(self, tool: str, *args: str) -> None:
        assert self.bin_dir is not None
        options: dict[str, Any] = {}
        if os.geteuid() == 0:
            options = {"user": "postgres", "group": "postgres"}
        done = subprocess.run(
            [str(self.bin_dir / tool), *args],
            capture_output=True,
            text=True,
            cwd=self.directory,
            check=False,
            **options,
        )
        if done.returncode != 0:
            raise RuntimeError(f"{tool} failed: {done.stderr.strip() or done.stdout.strip()}")

    def _pg_ctl(self, action: str, *extra: str) -> None:
        assert self.directory is not None
        opts = " ".join((f"-k {self.directory}", "-c listen_addresses=''", *self.settings))
        self._run("pg_ctl", action, "-D", str(self.directory / "data"), "-w", "-t", "60",
                  "-l", str(self.directory / "server.log"), "-o", opts, *extra)  # fmt: skip

    def restart(self) -> None:
        """Restart the server (fast shutdown: open transactions are rolled back and every
        connection is cut), as an operator or a crash-restart would."""
        if not self.throwaway:
            raise RuntimeError(f"cannot restart a server named by {ENV}")
        self._pg_ctl("restart", "-m", "fast")

    def stop_server(self) -> None:
        """Stop the server, keeping its files (:meth:`start_again` brings it back)."""
        self._pg_ctl("stop", "-m", "fast")

    def start_again(self) -> None:
        self._pg_ctl("start")

    def stop(self) -> None:
        if self.directory is None:
            return
        with contextlib.suppress(RuntimeError):  # already stopped
            self._pg_ctl("stop", "-m", "immediate")
        shutil.rmtree(self.directory, ignore_errors=True)
        self.directory = None


@contextmanager
def pg_server(settings: tuple[str, ...] = FAST) -> Iterator[Server]:
    server = Server.start(settings)
    try:
        yield server
    finally:
        server.stop()
