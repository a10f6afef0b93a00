"""Machines fired through ``transitions``: one shared machine per table, runs as models.

A run fires the machine of its config (``RunConfig.machine``, a
:class:`~fsm_agent._core.table.Machine` value). One ``transitions.Machine(model=None,
auto_transitions=False)`` is built per machine value, on first use, and cached by its hash;
a run (its :class:`~fsm_agent._core.state.RunState`) is fired through its
``events[trigger]`` and never attached with ``add_model`` (a list scan that slows past ~10k
runs). Each trigger's ``transitions`` event picks its edge with the one selector's walk
over that machine's edges (:func:`~fsm_agent._core.select.choose`; the engine's hot path
runs the same walk compiled per group, :func:`~fsm_agent._core.select.compile_choice`)
and sets the run's ``state`` as ``Machine.set_state`` would; an invalid source raises
the stock ``MachineError``.

Importing this module checks the default table (:func:`~fsm_agent._core.table.check_table`),
so a table that names an unknown guard, state or action fails at once; an application's
machine is checked the same way by :func:`compile_machine`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, cast, get_args

from transitions import Machine
from transitions.core import Event as TransitionsEvent

from fsm_agent._core.actions import ACTIONS
from fsm_agent._core.guards import GUARDS, GuardNames, guard_of
from fsm_agent._core.select import Choice, choose, compile_choice
from fsm_agent._core.table import (
    DEFAULT_MACHINE,
    INITIAL_STATE,
    STATES,
    TERMINAL_STATES,
    Reason,
    Transition,
    Trigger,
    check_table,
)
from fsm_agent._core.table import Machine as MachineValue
from fsm_agent._errors import ConfigError

if TYPE_CHECKING:
    from fsm_agent._core.state import RunState

__all__ = [
    "CHOICES",
    "RUN_MACHINE",
    "build_machine",
    "check_machine",
    "compile_machine",
    "engine_of",
    "fire",
]


class _Trigger(TransitionsEvent):
    """A trigger of this machine: its edge is chosen by the one selector's walk
    (:func:`~fsm_agent._core.select.choose`) over the group of the model's state, from the
    guard function passed with the model (``trigger(model, guard)``), not by the stock
    per-edge ``execute`` (whose empty callback lists and debug logging cost more than
    the choice itself on the hot path)."""

    #: source state -> the edges of this trigger there, in priority order.
    groups: dict[str, tuple[Transition, ...]]
    #: source state -> that group's walk as one function (:meth:`take`).
    choices: dict[str, Choice]

    def trigger(self, model: Any, *args: Any, **kwargs: Any) -> Any:
        edges = self.groups.get(model.state)
        if edges is None:  # no edge from here: stock MachineError
            return super().trigger(model, *args, **kwargs)
        edge = choose(edges, args[0])
        assert edge is not None, "every group ends with an unguarded edge"
        # What ``Machine.set_state`` does, minus its name lookup and list handling: the
        # destination is a state of this machine (``check_table`` verified every one).
        model.state = edge.dest
        return edge

    def take(self, model: Any) -> Transition:
        """:meth:`trigger` with the guards of ``GUARDS`` evaluated on ``model`` and each
        outcome recorded in a new ``model.guard_log``: the engine's hot path."""
        choice = self.choices.get(model.state)
        log: dict[str, bool] = {}
        model.guard_log = log
        if choice is None:  # no edge from here: stock MachineError
            return cast(Transition, super().trigger(model, log.__getitem__))
        edge = choice(model, GUARDS, log)
        assert edge is not None, "every group ends with an unguarded edge"
        model.state = edge.dest
        return edge


class _RunMachine(Machine):
    event_cls = _Trigger
    #: The machine value whose edges this one fires.
    table: MachineValue


def build_machine(table: MachineValue = DEFAULT_MACHINE) -> Machine:
    """The ``transitions`` machine of ``table`` (tests compare it with a stock one)."""
    machine = _RunMachine(
        model=None,
        states=list(table.states),
        initial=table.initial,
        auto_transitions=False,
        send_event=False,
        ignore_invalid_triggers=False,
    )
    # _Trigger skips the queue and the prepare/finalize/exception callbacks: none is set.
    assert not (
        machine.has_queue or machine.prepare_event or machine.finalize_event or machine.on_exception
    )
    machine.table = table
    for t in table.transitions:
        # Guards are listed for ``transitions`` (and its diagrams) by name; the choice is
        # made by ``select`` from the run's guard function.
        conditions: list[Any] = list(t.conditions)
        unless: list[Any] = list(t.unless)
        machine.add_transition(t.trigger, t.source, t.dest, conditions=conditions, unless=unless)
    for name, event in machine.events.items():
        groups = {source: table.edges_from(source, name) for source in event.transitions}
        cast(_Trigger, event).groups = groups
        cast(_Trigger, event).choices = {
            source: compile_choice(edges, _rule_guards(edges)) for source, edges in groups.items()
        }
    return machine


def _rule_guards(edges: tuple[Transition, ...]) -> dict[str, Any]:
    """The guards of ``edges`` that :data:`GUARDS` does not hold (rule rows, ``rule:<id>``),
    bound once for the compiled walk."""
    return {name: guard_of(name) for e in edges for name, _ in e.checks if name not in GUARDS}


def compile_machine(
    rows: Iterable[Transition],
    *,
    extends: MachineValue | None = None,
    name: str | None = None,
) -> MachineValue:
    """A checked machine value: ``rows`` as the whole table, or, with ``extends``, that
    machine plus ``rows`` (each tried after its group's guarded edges, before its
    fallback: :meth:`~fsm_agent._core.table.Machine.extended`). Raises
    :class:`~fsm_agent._errors.ConfigError` listing every problem ``check_table`` finds,
    and every trigger or reason the loop does not know."""
    rows = tuple(rows)
    bad = [r for r in rows if not isinstance(r, Transition)]
    if bad:
        raise ConfigError(f"a machine's rows must be Transition objects, got {bad[0]!r}")
    if extends is not None:
        table = extends.extended(rows, name=name)
    else:
        table = MachineValue.of(rows, name=name or "run machine")
    check_machine(table)
    return table


def check_machine(table: MachineValue) -> None:
    """Raise :class:`~fsm_agent._errors.ConfigError` listing every problem of ``table``:
    what ``check_table`` finds, and triggers, reasons or states the loop does not know.
    A table once found sound is not checked again."""
    if table.hash in _SOUND:
        return
    problems = check_table(table.transitions, GuardNames(), tuple(ACTIONS))
    if (table.states, table.terminal, table.initial) != (STATES, TERMINAL_STATES, INITIAL_STATE):
        problems.append(
            "the loop has one step per working state and ends at the terminal ones: a "
            f"machine keeps states {', '.join(STATES)} (terminal: "
            f"{', '.join(TERMINAL_STATES)}; initial {INITIAL_STATE}); add edges, not states"
        )
    keys: set[str] = set()
    for t in table.transitions:
        where = f"{t.label} ({t.source}->{t.dest})"
        if t.key in keys:  # a checkpoint names its last edge by key: it must be one edge
            problems.append(f"{where}: a second row with key {t.key!r}")
        keys.add(t.key)
        if t.trigger not in _TRIGGERS:
            problems.append(f"{where}: unknown trigger {t.trigger!r} (the loop fires "
                            f"{', '.join(_TRIGGERS)})")  # fmt: skip
        if t.reason is not None and t.reason not in _REASONS:
            problems.append(f"{where}: unknown reason {t.reason!r}")
    if problems:
        raise ConfigError(
            f"invalid machine {table.name!r}:\n  " + "\n  ".join(problems)
            + "\n(guards are the names of fsm_agent._core.guards.GUARDS, actions those of "
            "fsm_agent._core.actions.ACTIONS)"
        )  # fmt: skip
    _SOUND.add(table.hash)


_TRIGGERS: tuple[str, ...] = get_args(Trigger)
_REASONS: frozenset[str] = frozenset(get_args(Reason))
#: Hashes of the machines :func:`check_machine` passed.
_SOUND: set[str] = set()

_problems = check_table(DEFAULT_MACHINE.transitions, GUARDS)
if _problems:
    raise RuntimeError("invalid run machine table:\n  " + "\n  ".join(_problems))
_SOUND.add(DEFAULT_MACHINE.hash)

#: The shared ``transitions`` machine of the default table.
RUN_MACHINE: Machine = build_machine()
#: machine hash -> its shared ``transitions`` machine.
_ENGINES: dict[str, Machine] = {DEFAULT_MACHINE.hash: RUN_MACHINE}
#: machine hash -> trigger -> source state -> that group's compiled walk: what
#: :func:`fire` (and the loop's ``_fire``, which inlines it) looks up per transition
#: (dict lookups, no method call).
CHOICES: dict[str, dict[str, dict[str, Choice]]] = {}


def _register(table: MachineValue, engine: Machine) -> None:
    _ENGINES[table.hash] = engine
    CHOICES[table.hash] = {
        name: cast(_Trigger, event).choices for name, event in engine.events.items()
    }


_register(DEFAULT_MACHINE, RUN_MACHINE)


def engine_of(table: MachineValue) -> Machine:
    """The one shared ``transitions`` machine of ``table`` (built on first use; machines
    with one hash have one definition, so they share it)."""
    engine = _ENGINES.get(table.hash)
    if engine is None:
        engine = build_machine(table)
        _register(table, engine)
    return engine


def fire(state: RunState, trigger: str) -> Transition:
    """Take the edge of ``trigger`` from the run's state: evaluate its guards in table
    order, recording each outcome in ``state.guard_log``, and move the run. The caller
    runs the edge's action and writes the event (``core/loop.py``).

    :meth:`_Trigger.take` inlined (this runs five times per tool round): the compiled
    walk of the run's state is looked up directly, and only a state the trigger has no
    edge from goes through ``transitions`` (its stock ``MachineError``)."""
    # (A guard met twice in one choice is evaluated once: the compiled walk reads it back
    # from the fresh log, ``select.compile_choice``.)
    table = state.config.machine
    try:
        choice = CHOICES[table.hash][trigger][state.state]
    except KeyError:
        # A machine not fired yet (built now), or no edge of ``trigger`` from here
        # (``transitions`` raises its stock ``MachineError``); an unknown trigger
        # raises ``KeyError`` as before.
        engine_of(table)
        choices = CHOICES[table.hash][trigger]
        if state.state not in choices:
            taken = cast(_Trigger, _ENGINES[table.hash].events[trigger]).take(state)
            state.taken = taken
            return taken
        choice = choices[state.state]
    log: dict[str, bool] = {}
    state.guard_log = log
    edge = choice(state, GUARDS, log)
    assert edge is not None, "every group ends with an unguarded edge"
    state.state = edge.dest
    state.taken = edge
    return edge
