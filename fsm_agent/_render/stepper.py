"""Stepping through a trace in a terminal.

In a TTY the screen shows one step at a time (state, edge and guards, the decision or
observation payload), its lines wrapped to the terminal's width, and keys move:
``n``/→/space next, ``p``/← previous, ``j`` jump to a step number, ``g``/``G``
first/last, ``q`` quit; a step longer than the screen scrolls with ↓/↑ and
PgDn/PgUp. Outside a TTY (a pipe, a file, CI) the steps are printed as text, one block
per step, lines whole.
"""

from __future__ import annotations

import os
import shutil
import sys
from typing import TextIO

from fsm_agent._render.replay import Replay, describe_step

__all__ = ["print_steps", "step_interactively"]

_HELP = "n/→/space next   p/← previous   j jump   g first   G last   q quit"
_KEYS = {"n": 1, " ": 1, "\x1b[C": 1, "l": 1, "p": -1, "\x1b[D": -1, "h": -1}
# Scrolling inside a long step: lines for ↓/↑, screens (None) for PgDn/PgUp.
_SCROLL = {"\x1b[B": 1, "\x1b[A": -1, "\x1b[6~": None, "\x1b[5~": None}


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
            size = 1
            if data.startswith("\x1b[", i):
                # A CSI sequence ends at its final byte: "\x1b[C" (→), "\x1b[6~" (PgDn).
                end = i + 2
                while end < len(data) and not "@" <= data[end] <= "~":
                    end += 1
                size = min(end + 1, len(data)) - i
            _pending.append(data[i : i + size])
            i += size
    return _pending.pop(0)


def _screen(replay: Replay, n: int, note: str, offset: int = 0) -> tuple[str, int]:
    """The screen for step ``n`` scrolled down ``offset`` lines, and the offset used
    (clamped to the step's length)."""
    size = shutil.get_terminal_size((100, 24))
    lines = describe_step(replay, n, max(size.columns - 1, 20))
    room = max(size.lines - 3, 3)
    offset = max(0, min(offset, len(lines) - room))
    shown = lines[offset : offset + room]
    footer = note or _HELP
    if len(lines) > room:
        footer = (
            f"lines {offset + 1}-{offset + len(shown)} of {len(lines)}  ↓/↑ PgDn/PgUp scroll"
            + ("   " + footer if len(footer) + 40 < size.columns else "")
        )
    # Clear the screen, home the cursor, draw; "\r\n" because the terminal is in cbreak mode.
    return "\x1b[2J\x1b[H" + "\r\n".join(shown) + "\r\n\r\n" + footer + "\r\n", offset


def _page() -> int:
    return max(shutil.get_terminal_size((100, 24)).lines - 4, 1)


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
    n, note, offset = start, "", 0
    try:
        tty.setcbreak(fd)
        while True:
            screen, offset = _screen(replay, n, note, offset)
            stdout.write(screen)
            stdout.flush()
            note = ""
            key = _read_key(fd)
            if key in ("q", "\x1b", "\x03", "\x04"):
                break
            if key in _SCROLL:
                step = _SCROLL[key]
                offset += step if step is not None else _page() * (1 if key.endswith("6~") else -1)
                continue
            offset = 0  # any other key shows a step from its top
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
