"""The determinism trap: while a core test runs, the clock, files, randomness, sockets and
logging are booby-trapped, so the sans-I/O core is checked at run time, not only by the
layering test's import list (a builtin such as ``open``, or a callable injected into the
loop, passes that list straight through). Temporal's workflow sandbox does the same for
workflow code. Every test under ``tests/core/`` gets it.

A trapped call raises :class:`DeterminismViolation` and is also recorded, so a call whose
error the code under test swallows (``except Exception``) still fails the test.
"""

from __future__ import annotations

import builtins
import datetime
import io
import logging
import os
import random
import socket
import time
import uuid
from collections.abc import Callable, Generator, Iterator
from typing import Any

import pytest

#: Whether a test's call phase failed (then a trapped call already failed it, once).
_CALL_FAILED = pytest.StashKey[bool]()


class DeterminismViolation(AssertionError):
    """A core test touched the world (the clock, a file, randomness, a socket, logging)."""


#: (module or class, attribute, what it is) of every trapped primitive.
TRAPPED: tuple[tuple[Any, str, str], ...] = (
    *((time, name, "the clock") for name in (
        "time", "time_ns", "monotonic", "monotonic_ns", "perf_counter", "perf_counter_ns",
        "process_time", "sleep", "localtime", "gmtime", "ctime", "asctime",
    )),
    (builtins, "open", "a file"),
    (io, "open", "a file"),
    (os, "open", "a file"),
    (os, "urandom", "randomness"),
    (os, "getrandom", "randomness"),
    *((random, name, "randomness") for name in (
        "random", "randint", "randrange", "choice", "choices", "shuffle", "sample", "uniform",
        "getrandbits", "gauss", "seed",
    )),
    (uuid, "uuid1", "randomness"),
    (uuid, "uuid4", "randomness"),
    (socket, "socket", "a socket"),
    (socket, "create_connection", "a socket"),
    (socket, "getaddrinfo", "a socket"),
    *((logging.Logger, name, "logging") for name in (
        "debug", "info", "warning", "error", "exception", "critical", "log",
    )),
    *((logging, name, "logging") for name in (
        "debug", "info", "warning", "error", "exception", "critical", "log",
    )),
)  # fmt: skip


class _TrappedDatetime(datetime.datetime):
    """``datetime.datetime`` whose readings of the clock are trapped."""

    trap: Trap

    @classmethod
    def now(cls, tz: Any = None) -> Any:
        cls.trap.trip("datetime.datetime.now", "the clock")

    @classmethod
    def utcnow(cls) -> Any:
        cls.trap.trip("datetime.datetime.utcnow", "the clock")

    @classmethod
    def today(cls) -> Any:
        cls.trap.trip("datetime.datetime.today", "the clock")


class _TrappedDate(datetime.date):
    trap: Trap

    @classmethod
    def today(cls) -> Any:
        cls.trap.trip("datetime.date.today", "the clock")


class Trap:
    """What was trapped during one test (``tripped``: one line per call)."""

    def __init__(self) -> None:
        self.tripped: list[str] = []

    def trip(self, name: str, what: str) -> Any:
        self.tripped.append(f"{name}() ({what})")
        raise DeterminismViolation(
            f"a core test called {name}(): {what} is outside the sans-I/O core (take it "
            "as a request's answer, e.g. ReadClock, or move the test out of tests/core/)"
        )

    def stand_in(self, owner: Any, attr: str, what: str) -> Callable[..., Any]:
        name = f"{owner.__name__}.{attr}"  # a module's or a class's

        def trapped(*args: Any, **kwargs: Any) -> Any:
            return self.trip(name, what)

        return trapped


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    if report.when == "call":
        item.stash[_CALL_FAILED] = report.failed
    return report


@pytest.fixture(autouse=True)
def determinism_trap(
    monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> Iterator[Trap]:
    """Every primitive of :data:`TRAPPED` (and ``datetime``'s clock) raises while the test
    runs; the test fails if any was called, even if the error was caught."""
    trap = Trap()
    for owner, attr, what in TRAPPED:
        if hasattr(owner, attr):
            monkeypatch.setattr(owner, attr, trap.stand_in(owner, attr, what))
    _TrappedDatetime.trap = _TrappedDate.trap = trap
    monkeypatch.setattr(datetime, "datetime", _TrappedDatetime)
    monkeypatch.setattr(datetime, "date", _TrappedDate)
    yield trap
    monkeypatch.undo()  # before pytest's own teardown reads the clock or writes files
    if trap.tripped and not request.node.stash.get(_CALL_FAILED, False):
        pytest.fail("the core touched the world: " + "; ".join(trap.tripped), pytrace=False)
