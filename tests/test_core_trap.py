"""The determinism trap of tests/core/ fails a core test that touches the world even when
the code under test swallows the error, and leaves a pure test alone."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

TRAP = Path(__file__).parent / "core" / "conftest.py"


def test_the_trap_fails_a_test_whose_code_swallows_the_violation(
    pytester: pytest.Pytester,
) -> None:
    pytester.makeconftest(TRAP.read_text())
    pytester.makepyfile(
        test_core="""
import time
import uuid

def careless_clock():
    try:
        return time.monotonic()
    except Exception:
        return 0.0

def test_swallows():
    assert careless_clock() == 0.0

def test_id():
    uuid.uuid4()

def test_pure():
    assert sorted([2, 1]) == [1, 2]
"""
    )
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider")
    # test_swallows passes its call and errors in teardown: the trap saw the clock.
    result.assert_outcomes(passed=2, failed=1, errors=1)
    out = result.stdout.str()
    assert "the core touched the world: time.monotonic() (the clock)" in out
    assert "a core test called uuid.uuid4(): randomness" in out
