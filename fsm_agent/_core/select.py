"""The one edge selector: which edge a trigger takes, given its guards' outcomes.

The engine, the trace checker, replay and the testing toolkit all call :func:`select`, so
"which edge do these outcomes pick" is coded once. It walks the edges of ``trigger`` in
``state`` in priority order and, within an edge, its guards in the order the table lists
them, asking ``guard(name)`` only until one fails: the engine passes a function that
evaluates (and records) the guard; the checker passes the recorded outcomes, so a guard
that decided the choice but was not recorded raises :class:`GuardNotRecorded`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from fsm_agent._core.table import Transition, edges_from

if TYPE_CHECKING:
    from fsm_agent._core.table import Machine

__all__ = ["Choice", "GuardNotRecorded", "choose", "compile_choice", "select", "select_recorded"]


class GuardNotRecorded(LookupError):
    """Choosing the edge needs the outcome of ``name``, which was not given."""

    def __init__(self, name: str, edge: Transition) -> None:
        super().__init__(
            f"the outcome of guard {name!r} decides {edge.label} -> {edge.dest}, "
            "and it was not recorded"
        )
        self.name = name
        self.edge = edge


def select(
    state: str, trigger: str, guard: Callable[[str], bool], machine: Machine | None = None
) -> Transition | None:
    """The edge ``trigger`` takes from ``state`` in ``machine`` (default: the default
    table): the first in priority order whose guards all hold. ``None`` when the table has
    no edge of ``trigger`` out of ``state``.

    ``guard(name)`` gives a guard's outcome; it is asked in table order and only as far as
    the choice needs, so the names asked are exactly the outcomes a trace records.
    """
    edges = edges_from(state, trigger) if machine is None else machine.edges_from(state, trigger)
    return choose(edges, guard)


def choose(edges: tuple[Transition, ...], guard: Callable[[str], bool]) -> Transition | None:
    """The walk :func:`select` makes over one group of edges (the engine, which has looked
    the group up already, calls it directly)."""
    for edge in edges:
        for name, want in edge.checks:
            if guard(name) is not want:
                break
        else:
            return edge
    return None  # a valid table ends every group with an unguarded edge: no trigger there


#: ``choice(model, guards, log)``: the edge a group's guards pick (:func:`compile_choice`).
Choice = Callable[[Any, Mapping[str, Callable[[Any], bool]], dict[str, bool]], "Transition | None"]


def compile_choice(
    edges: tuple[Transition, ...], fixed: Mapping[str, Callable[[Any], bool]] | None = None
) -> Choice:
    """:func:`choose` over ``edges`` as one function, for the engine's hot path (some
    thirty guards per tool round): ``choice(model, guards, log)`` calls
    ``guards[name](model)`` for each guard the walk meets, in the same order (once: a
    guard met again is read from ``log``), writes each outcome to ``log``, and returns
    the same edge.

    The walk is written out as straight-line code (as ``dataclasses`` writes
    ``__init__``): one call site per guard instead of one shared by every guard, which
    the interpreter cannot specialise, and no loop or callback per guard. Guards are
    looked up in ``guards`` when met, so a replaced guard takes effect at once; those
    named in ``fixed`` (an application's rule rows, ``rule:<id>``, which no guard table
    holds) are bound when compiled. ``tests/test_machine_equivalence.py`` compares it
    with :func:`choose`.
    """
    fixed = dict(fixed or {})
    lines = ["def choice(model, guards, log):"]
    # A guard met again in the same walk (``strict_policy`` follows every refusal edge,
    # and each rule row of ``validate``) is not evaluated again: guards are pure, so its
    # outcome is the one logged. Where it was surely evaluated (the first check of an
    # earlier edge, or an earlier check of this one) it is read from the log; where it
    # may have been (a later check of an earlier edge), looked up and evaluated if absent.
    #
    # Consecutive edges whose first check is the same (each rule row of ``validate``
    # starts with ``strict_policy``) share one test of it: where it fails, the walk skips
    # them all at once; where it holds, each edge's other checks follow in order.
    surely: set[str] = set()  # evaluated on every path that reaches the current edge
    maybe: set[str] = set()  # evaluated on some of them
    shared: tuple[str, bool] | None = None  # the first check of the open run of edges
    for i, edge in enumerate(edges):
        depth, here, checks = 1, set(surely), edge.checks
        if checks and checks[0] == shared:
            depth, checks = 2, checks[1:]  # inside the run's test of its first check
            here.add(shared[0])
        else:
            shared = edge.checks[0] if edge.checks else None
        for name, want in checks:
            source = "fixed" if name in fixed else "guards"
            lines += _test_lines("    " * depth, name, want, source, here, maybe)
            here.add(name)
            depth += 1
        if edge.checks:
            surely.add(edge.checks[0][0])
            maybe.update(name for name, _ in edge.checks[1:])
        lines.append(f"{'    ' * depth}return edges[{i}]")
        if not edge.checks:
            break  # an unguarded edge: nothing after it is reached
    else:
        lines.append("    return None")
    namespace: dict[str, Any] = {"edges": edges, "fixed": fixed}
    # Safe to execute: the code holds only the table's guard names, repr-quoted.
    exec("\n".join(lines), namespace)
    choice: Choice = namespace["choice"]
    return choice


def _test_lines(
    pad: str, name: str, want: bool, source: str, here: set[str], maybe: set[str]
) -> list[str]:
    """The lines that read guard ``name`` (from the log where it was surely evaluated
    before, evaluating it where it may not have been) and test it for ``want``."""
    if name in here:
        read = [f"{pad}value = log[{name!r}]"]
    elif name in maybe:
        read = [f"{pad}value = log.get({name!r})", f"{pad}if value is None:",
                f"{pad}    value = log[{name!r}] = {source}[{name!r}](model)"]  # fmt: skip
    else:
        read = [f"{pad}value = log[{name!r}] = {source}[{name!r}](model)"]
    return [*read, f"{pad}if value is {want}:"]


def select_recorded(
    state: str,
    trigger: str,
    outcomes: Mapping[str, object],
    *,
    legacy: bool = False,
    machine: Machine | None = None,
) -> Transition | None:
    """:func:`select` over recorded outcomes; :class:`GuardNotRecorded` if one it needs is
    missing. Outcomes that are not booleans count as not holding.

    ``legacy``: the outcomes come from a ``fsm-agent.trace/1`` trace, whose engine
    evaluated an edge's positive guards before its negated ones; the same order is used
    to decide which outcomes must be there.
    """
    edges = edges_from(state, trigger) if machine is None else machine.edges_from(state, trigger)
    for edge in edges:
        checks = edge.checks
        if legacy:
            checks = tuple(c for c in checks if c[1]) + tuple(c for c in checks if not c[1])
        for name, want in checks:
            try:
                value = outcomes[name]
            except KeyError:
                raise GuardNotRecorded(name, edge) from None
            if (value is True) is not want:
                break
        else:
            return edge
    return None
