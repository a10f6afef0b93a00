"""Stepping through a trace in a terminal.

In a TTY the screen shows one step at a time (state, edge and guards, the decision or
observation payload) and keys move: ``n``/→/space next, ``p``/← previous, ``j`` jump to
a step number, ``g``/``G`` first/last, ``q`` quit. Outside a TTY (a pipe, a file, CI)
the steps are printed as text, one block per step.
"""

from __future__ import annotations

import os
import shutil
import sys
from typing import TextIO

from fsm_agent.render.replay import Replay, describe_step

__all__ = ["print_steps", "step_interactively"]

_HELP = "n/→/space next   p/← previous   j jump   g first   G last   q quit"
_KEYS = {"n": 1, " ": 1, "\x1b[C": 1, "l": 1, "p": -1, "\x1b[D": -1, "h": -1}


def print_steps(replay: Replay, out: TextIO, only: int | None = None) -> None:
    """Print every step (or just step ``only``) as text, lines whole (for grep and less)."""
    steps = range(len(replay)) if only is None else [only]
    for n in steps:
        out.write("\n".join(describe_step(replay, n)) + "\n\n")


_pending: list[str] = []


def _read_key(fd: int) -> str:
    """One key press; a read may carry several (typed fast, pasted), so they queue."""
    if not _pending:
        data = os.read(fd, 64).decode("utf-8", "replace")
        if not data:
            return "q"  # the terminal went away
        i = 0
        while i < len(data):
            size = 3 if data.startswith("\x1b[", i) and i + 2 < len(data) else 1
            _pending.append(data[i : i + size])
            i += size
    return _pending.pop(0)


def _screen(replay: Replay, n: int, note: str) -> str:
    size = shutil.get_terminal_size((100, 24))
    lines = describe_step(replay, n, size.columns)
    room = max(size.lines - 3, 3)
    if len(lines) > room:
        lines = [*lines[: room - 1], f"  … {len(lines) - room + 1} more line(s)"]
    footer = note or _HELP
    # Clear the screen, home the cursor, draw; "\r\n" because the terminal is in cbreak mode.
    return "\x1b[2J\x1b[H" + "\r\n".join(lines) + "\r\n\r\n" + footer + "\r\n"


def step_interactively(
    replay: Replay, start: int = 0, stdin: TextIO | None = None, stdout: TextIO | None = None
) -> None:
    """The key-driven stepper; the caller checked that both ends are a TTY."""
    import termios
    import tty

    stdin = stdin or sys.stdin
    stdout = stdout or sys.stdout
    fd = stdin.fileno()
    saved = termios.tcgetattr(fd)
    n, note = start, ""
    try:
        tty.setcbreak(fd)
        while True:
            stdout.write(_screen(replay, n, note))
            stdout.flush()
            note = ""
            key = _read_key(fd)
            if key in ("q", "\x1b", "\x03", "\x04"):
                break
            if key in _KEYS:
                n = min(max(n + _KEYS[key], 0), len(replay) - 1)
            elif key == "g":
                n = 0
            elif key == "G":
                n = len(replay) - 1
            elif key == "j":
                target = _read_number(fd, stdout)
                if target is not None and 0 <= target < len(replay):
                    n = target
                elif target is not None:
                    note = f"no step {target}: steps are 0-{len(replay) - 1}"
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)
        stdout.write("\r\n")
        stdout.flush()


def _read_number(fd: int, stdout: TextIO) -> int | None:
    """Read digits until Enter (echoing them: cbreak mode does not); Esc cancels."""
    stdout.write("jump to step: ")
    stdout.flush()
    digits = ""
    while True:
        key = _read_key(fd)
        if key in ("\r", "\n"):
            return int(digits) if digits else None
        if key in ("\x1b", "q"):
            return None
        if key in ("\x7f", "\b") and digits:
            digits = digits[:-1]
            stdout.write("\b \b")
        elif key.isdigit():
            digits += key
            stdout.write(key)
        stdout.flush()
