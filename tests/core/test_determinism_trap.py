"""The determinism trap of ``tests/core/conftest.py`` fires for every kind of primitive
it guards (tests/test_core_trap.py proves a swallowed call still fails the test)."""

from __future__ import annotations

import contextlib
import datetime
import logging
import os
import random
import socket
import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest

from core.conftest import DeterminismViolation, Trap

CALLS: dict[str, tuple[Callable[[], Any], str]] = {
    "time.time": (lambda: time.time(), "the clock"),
    "time.monotonic": (lambda: time.monotonic(), "the clock"),
    "time.perf_counter": (lambda: time.perf_counter(), "the clock"),
    "time.sleep": (lambda: time.sleep(0), "the clock"),
    "datetime.datetime.now": (lambda: datetime.datetime.now(), "the clock"),
    "datetime.datetime.utcnow": (lambda: datetime.datetime.utcnow(), "the clock"),
    "datetime.date.today": (lambda: datetime.date.today(), "the clock"),
    "builtins.open": (lambda: open("anything.txt"), "a file"),  # noqa: SIM115
    "os.open": (lambda: os.open("anything.txt", os.O_RDONLY), "a file"),
    "os.urandom": (lambda: os.urandom(4), "randomness"),
    "random.random": (lambda: random.random(), "randomness"),
    "random.choice": (lambda: random.choice([1, 2]), "randomness"),
    "uuid.uuid4": (lambda: uuid.uuid4(), "randomness"),
    "socket.socket": (lambda: socket.socket(), "a socket"),
    "socket.create_connection": (lambda: socket.create_connection(("h", 1)), "a socket"),
    "Logger.info": (lambda: logging.getLogger("fsm_agent").info("hi"), "logging"),
    "logging.warning": (lambda: logging.warning("hi"), "logging"),
}


@pytest.mark.parametrize("name", sorted(CALLS))
def test_the_trap_fires(name: str, determinism_trap: Trap) -> None:
    fn, what = CALLS[name]
    with pytest.raises(DeterminismViolation, match="outside the sans-I/O core"):
        fn()
    assert len(determinism_trap.tripped) == 1
    assert determinism_trap.tripped[0].endswith(f"() ({what})")
    assert name.rpartition(".")[2] in determinism_trap.tripped[0]
    determinism_trap.tripped.clear()  # tripped on purpose: let this test pass


def test_a_swallowed_call_is_still_recorded(determinism_trap: Trap) -> None:
    with contextlib.suppress(Exception):  # what careless core code would do
        time.time()
    assert determinism_trap.tripped == ["time.time() (the clock)"]
    determinism_trap.tripped.clear()
