"""The table fired through ``transitions``: one shared machine, runs fired as models.

One ``transitions.Machine(model=None, auto_transitions=False)`` is built from the table
at import; a run (its :class:`~fsm_agent.core.state.RunState`) is fired through
``RUN_MACHINE.events[trigger]`` and never attached with ``add_model`` (a list scan that
slows past ~10k runs). Each trigger's ``transitions`` event picks its edge with the one
selector (:func:`~fsm_agent.core.select.select`) and sets the run's ``state`` as
``Machine.set_state`` would; an invalid source raises the stock ``MachineError``.

Importing this module checks the table (:func:`~fsm_agent.core.table.check_table`), so a
table that names an unknown guard, state or action fails at once.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

from transitions import Machine
from transitions.core import Event as TransitionsEvent

from fsm_agent.core.guards import GUARDS
from fsm_agent.core.select import select
from fsm_agent.core.table import INITIAL_STATE, STATES, TRANSITIONS, Transition, check_table

if TYPE_CHECKING:
    from fsm_agent.core.state import RunState

__all__ = ["RUN_MACHINE", "build_machine", "fire"]


class _Trigger(TransitionsEvent):
    """A trigger of this machine: its edge is chosen by :func:`select` from the guard
    function passed with the model (``trigger(model, guard)``), not by the stock
    per-edge ``execute`` (whose empty callback lists and debug logging cost more than
    the choice itself on the hot path)."""

    def trigger(self, model: Any, *args: Any, **kwargs: Any) -> Any:
        if model.state not in self.transitions:  # no edge from here: stock MachineError
            return super().trigger(model, *args, **kwargs)
        edge = select(model.state, self.name, args[0])
        assert edge is not None, "every group ends with an unguarded edge"
        # What ``Machine.set_state`` does, minus its name lookup and list handling: the
        # destination is a state of this machine (``check_table`` verified every one).
        model.state = edge.dest
        return edge


class _RunMachine(Machine):
    event_cls = _Trigger


def build_machine() -> Machine:
    """The machine of :data:`TRANSITIONS` (tests compare it with a stock one)."""
    machine = _RunMachine(
        model=None,
        states=list(STATES),
        initial=INITIAL_STATE,
        auto_transitions=False,
        send_event=False,
        ignore_invalid_triggers=False,
    )
    # _Trigger skips the queue and the prepare/finalize/exception callbacks: none is set.
    assert not (
        machine.has_queue or machine.prepare_event or machine.finalize_event or machine.on_exception
    )
    for t in TRANSITIONS:
        # Guards are listed for ``transitions`` (and its diagrams) by name; the choice is
        # made by ``select`` from the run's guard function.
        conditions: list[Any] = list(t.conditions)
        unless: list[Any] = list(t.unless)
        machine.add_transition(t.trigger, t.source, t.dest, conditions=conditions, unless=unless)
    return machine


_problems = check_table(TRANSITIONS, GUARDS)
if _problems:
    raise RuntimeError("invalid run machine table:\n  " + "\n  ".join(_problems))

#: The one shared ``transitions`` machine; runs are fired through ``RUN_MACHINE.events``.
RUN_MACHINE: Machine = build_machine()
_EVENTS = RUN_MACHINE.events


def fire(state: RunState, trigger: str) -> Transition:
    """Take the edge of ``trigger`` from the run's state: evaluate its guards in table
    order, recording each outcome in ``state.guard_log``, and move the run. The caller
    runs the edge's action and writes the event (``core/loop.py``)."""
    log: dict[str, bool] = {}
    state.guard_log = log

    def guard(name: str) -> bool:
        # (A guard met twice in one choice is evaluated twice: pure, and cheaper than
        # a memo on the hot path.)
        value = log[name] = GUARDS[name](state)
        return value

    edge = cast(Transition, _EVENTS[trigger].trigger(state, guard))
    state.taken = edge
    return edge
