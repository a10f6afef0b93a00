"""The fast tier's pinned request sequences are the real driver's.

``tests/core/test_suite_sansio.py`` drives the suite's scenarios by hand and compares each
run's requests with ``tests/core/suite_requests.json``; here the same scenarios run
through ``Runtime`` (the sync driver, its threads and store), and every request the driver
performs is recorded by an interceptor and compared with the same pins. So a change to the
loop's protocol changes both tiers' expectations at once. Regenerate the pins with
``python tests/test_suite_requests.py`` after a deliberate change, and commit them.
"""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from fsm_agent._core.requests import CallTool, Request
from fsm_agent._runtime.interceptors import CallNext, Interceptor, observing
from fsm_agent.testing._scenarios import Scenario
from fsm_agent.testing._suite import SUITE

PINS_FILE = Path(__file__).parent / "core" / "suite_requests.json"


def label(request: Request) -> str:
    kind = type(request).__name__
    return f"{kind}:{request.tool}" if isinstance(request, CallTool) else kind


class Requests(Interceptor):
    """The label of every request a driver performs, in order (the scenario's runs one
    after the other)."""

    def __init__(self) -> None:
        self.seen: list[str] = []

    def intercept(self, request: Request, call_next: CallNext) -> Any:
        self.seen.append(label(request))
        return call_next(request)


def driven(scenario: Scenario) -> list[str]:
    recorder = Requests()
    with observing(recorder):
        scenario.run()
    return recorder.seen


PINS: dict[str, list[list[str]]] = json.loads(PINS_FILE.read_text(encoding="utf-8"))
PINNED = [s for s in SUITE if s.name in PINS]


@pytest.mark.parametrize("scenario", PINNED, ids=[s.name for s in PINNED])
def test_the_driver_performs_the_pinned_requests(scenario: Scenario) -> None:
    assert driven(scenario) == [label for run in PINS[scenario.name] for label in run]


if __name__ == "__main__":  # regenerate the pins from the hand tier's scenarios
    sys.path.insert(0, str(Path(__file__).parent))
    hand = importlib.import_module("core.test_suite_sansio")
    pins = {s.name: hand.hand_drive(s)[0] for s in hand.HAND}
    PINS_FILE.write_text(json.dumps(pins, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {PINS_FILE} ({len(pins)} scenarios)")
