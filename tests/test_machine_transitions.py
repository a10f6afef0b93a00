"""Every transition of the table, driven by a run that takes it.

The scenarios are the toolkit's per-edge suite (``fsm_agent.testing._suite``), the same
one users run against their own engines: each drives a run through one edge and asserts
the edge was taken, where the run stopped and why, its counters, a provider-valid
history, a trace the checker accepts, no write taking effect twice, and the side effects
its fault tools logged. ``test_every_transition_has_a_scenario`` keeps the suite
complete when the table grows.
"""

from __future__ import annotations

import pytest

from fsm_agent._core.table import TRANSITIONS
from fsm_agent.testing._scenarios import Scenario
from fsm_agent.testing._suite import SUITE, missing, scenario_for


def test_every_transition_has_a_scenario() -> None:
    assert missing() == [], "edges without a scenario in fsm_agent/testing/_suite.py"
    assert [s.edge.index for s in SUITE] == sorted(s.edge.index for s in SUITE)
    assert len({s.target for s in SUITE}) == len(SUITE) == len(TRANSITIONS)
    assert all(scenario_for(t) is not None for t in TRANSITIONS)


@pytest.mark.parametrize("scenario", SUITE, ids=[s.name for s in SUITE])
def test_transition(scenario: Scenario) -> None:
    scenario.verify()
