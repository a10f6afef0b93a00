"""Who drives a run: owner identities that a restart cannot impersonate (R11).

An owner token is ``host|space|pid|start|token``: the host name; the PID space, which is
the kernel's boot id and the inode of the process's PID namespace
(``/proc/self/ns/pid``), as ``boot:inode``; the process id, the process's start time
(clock ticks since boot, from ``/proc``) and a random token per driving. A claim is
*live* when:

* it was made by this process: its token is one this process is still driving with
  (so a claim left behind by a run that failed here is reclaimable at once);
* it was made in this PID space (this host, this boot, this PID namespace): that pid
  still runs *and* started at the recorded time — so a recycled pid is not mistaken
  for the dead owner;
* otherwise its lease has not expired. The driver renews the lease while it drives
  (heartbeats). That covers another host or boot, and a process whose PIDs this one
  cannot see: another PID namespace on this host (a container with host networking
  shares the host name and the boot id, and its PID 1 is not ours), or a ``/proc``
  that is not this namespace's (``/proc/self`` is not our pid). A PID it cannot see
  is never trusted, alive or dead: the space is ``-`` then, and only the lease counts.
"""

from __future__ import annotations

import os
import socket
import threading
from functools import cache
from typing import Protocol

__all__ = [
    "drives_here",
    "drop",
    "here_prefix",
    "hold",
    "is_dead",
    "is_live",
    "let_go",
    "new_owner",
    "process_gone",
]

_SEP = "|"
_LIVE: set[str] = set()
_LOCK = threading.Lock()


@cache
def _boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as handle:
            return handle.read().strip()
    except OSError:
        return "-"


def _start_time(pid: int) -> str:
    """The process's start time in clock ticks since boot, or ``"-"`` if unknown."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as handle:
            stat = handle.read()
    except OSError:
        return "-"
    # Field 22; the command name (field 2) may hold spaces and parentheses.
    fields = stat[stat.rfind(")") + 2 :].split()
    return fields[19] if len(fields) > 19 else "-"


def _pid_space(pid: int) -> str:
    """``boot:inode`` of this process's PID namespace, or ``"-"`` when this process
    cannot tell which PIDs it sees (no ``/proc``, or one mounted for another namespace:
    its ``self`` is not our pid)."""
    boot = _boot_id()
    try:
        if os.readlink("/proc/self") != str(pid):
            return "-"
        inode = os.stat("/proc/self/ns/pid").st_ino
    except (OSError, ValueError):
        return "-"
    return "-" if boot == "-" else f"{boot}:{inode}"


@cache
def _this_process() -> tuple[str, str, str, str]:
    pid = os.getpid()
    space = _pid_space(pid)
    return socket.gethostname(), space, str(pid), _start_time(pid) if space != "-" else "-"


def _reset_after_fork() -> None:
    _this_process.cache_clear()
    with _LOCK:
        _LIVE.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_after_fork)


def new_owner() -> str:
    """A fresh owner token for one driving of one run."""
    return _SEP.join((*_this_process(), os.urandom(6).hex()))


def hold(owner: str) -> None:
    """Mark ``owner`` as driving in this process (until :func:`drop`)."""
    with _LOCK:
        _LIVE.add(owner)


def drop(owner: str) -> None:
    with _LOCK:
        _LIVE.discard(owner)


class _Releases(Protocol):
    def release(self, run_id: str, owner: str) -> None: ...


def let_go(store: _Releases, run_id: str, owner: str) -> None:
    """Give ``owner``'s claim on ``run_id`` back to ``store`` and stop driving with it —
    dropped here even when the store fails (the claim it keeps is then reclaimable at
    once by this process)."""
    try:
        store.release(run_id, owner)
    finally:
        drop(owner)


def here_prefix() -> str | None:
    """What every owner token made in this PID space starts with (``host|space|``), so a
    store can find the claims whose processes this one can ask about; ``None`` where
    it cannot tell which PIDs it sees."""
    host, space, _, _ = _this_process()
    return None if space == "-" else f"{host}{_SEP}{space}{_SEP}"


def process_gone(owner: str | None) -> bool:
    """Whether ``owner`` was made by another process of this PID space that is gone (a
    worker SIGKILLed or OOM-killed): its claims can be taken at once. Never true of this
    process's own tokens (whose claims this process settles itself)."""
    if not owner:
        return False
    parts = owner.split(_SEP)
    if len(parts) != 5 or tuple(parts[2:4]) == _this_process()[2:]:
        return False
    return is_dead(owner)


def drives_here(owner: str | None) -> bool:
    """Whether ``owner`` is a token this process is still driving with: its claim holds
    whatever its lease says (a store outage longer than the lease lets it lapse while
    the driver works on)."""
    with _LOCK:
        return owner in _LIVE


def is_live(owner: str | None, lease_until: float, now: float) -> bool:
    """Whether a claim by ``owner`` still holds (see the module docstring)."""
    if not owner:
        return False
    if drives_here(owner):
        return True
    parts = owner.split(_SEP)
    if len(parts) != 5:
        return lease_until > now  # a token of another version: trust only its lease
    host, boot, pid, start, _ = parts
    me = _this_process()
    if (host, boot) != me[:2] or boot == "-":
        return lease_until > now
    if (pid, start) == me[2:]:
        with _LOCK:
            return owner in _LIVE
    if start == "-" or not pid.isdigit():
        return lease_until > now
    return _start_time(int(pid)) == start


def is_dead(owner: str | None) -> bool:
    """Whether ``owner`` certainly drives nothing any more: it was made in this PID space
    (this host, boot and PID namespace) and its process is gone (or is this process,
    which no longer drives with it). A store whose claims are judged by lease alone (a
    fleet sharing PostgreSQL, where a stalled process is alive yet must lose its runs)
    may still take such a claim at once instead of waiting for the lease."""
    if not owner:
        return True
    parts = owner.split(_SEP)
    if len(parts) != 5:
        return False
    host, boot, pid, start, _ = parts
    me = _this_process()
    if (host, boot) != me[:2] or boot == "-" or start == "-" or not pid.isdigit():
        return False
    if (pid, start) == me[2:]:
        with _LOCK:
            return owner not in _LIVE
    return _start_time(int(pid)) != start
