"""Assertions about runs, with failure messages that show what happened.

Each raises ``AssertionError`` (so pytest reports it as a test failure) with the path
taken next to the path expected and the first step where they differ.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from fsm_agent._core.history import check_history
from fsm_agent._trace.checker import check_events
from fsm_agent.testing._agent import AgentUnderTest, Ledger
from fsm_agent.testing._faults import FaultyTool, FaultyTools

__all__ = [
    "assert_history_valid",
    "assert_no_duplicate_writes",
    "assert_path",
    "assert_stopped",
    "assert_trace_legal",
    "collapsed",
    "duplicate_writes",
    "parse_path",
]


class _HasPath(Protocol):
    @property
    def path(self) -> list[str]: ...


class _HasEvents(Protocol):
    events: list[dict[str, Any]]


def _states(result: _HasPath | Sequence[str]) -> list[str]:
    if isinstance(result, Sequence):
        return [str(s) for s in result]
    return list(result.path)


def _numbered(states: Sequence[str]) -> str:
    return "  ".join(f"{i}:{s}" for i, s in enumerate(states))


def collapsed(states: Sequence[str]) -> list[str]:
    """``states`` with consecutive repeats written once: the path the demo prints (the
    dispatch self-loop ``executing -> executing`` adds nothing a reader needs)."""
    out: list[str] = []
    for state in states:
        if not out or out[-1] != state:
            out.append(state)
    return out


_TOKEN = re.compile(r"\s*(?:(→|->)|(\()|(\))\s*(?:[×x\*](\d+))?|([A-Za-z_][A-Za-z_0-9]*))")


def parse_path(text: str) -> list[str]:
    """The states of a path written as the demo prints it: ``a → (b → c) ×2 → d``
    (``->`` for ``→`` and ``x2`` for ``×2`` work too), a repeated block expanded."""
    stack: list[list[str]] = [[]]
    pos, expect_state = 0, True
    text = text.strip()
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None or m.end() == pos:
            raise ValueError(
                f"path {text!r}: cannot read {text[pos:].strip()!r} at character {pos}; "
                "write states joined by '→' (or '->'), a repeated block as '(a → b) ×2'"
            )
        arrow, opening, _closing, times, name = m.groups()
        at = m.end() - len(m.group().lstrip())  # where the token starts, past blanks
        if name is not None or opening is not None:
            if not expect_state:
                raise ValueError(f"path {text!r}: missing '→' before {m.group().strip()!r}")
            if name is not None:
                stack[-1].append(name)
                expect_state = False
            else:
                stack.append([])
        elif arrow is not None:
            if expect_state:
                raise ValueError(f"path {text!r}: '→' at character {at} follows no state")
            expect_state = True
        else:
            if len(stack) == 1 or expect_state:
                raise ValueError(f"path {text!r}: unbalanced ')' at character {at}")
            block = stack.pop()
            stack[-1].extend(block * int(times or 1))
        pos = m.end()
    if len(stack) != 1:
        raise ValueError(f"path {text!r}: a '(' is never closed")
    if expect_state and stack[0]:
        raise ValueError(f"path {text!r}: ends with '→'")
    return stack[0]


def assert_path(
    result: _HasPath | Sequence[str], expected: Sequence[str] | str, *, exact: bool | None = None
) -> None:
    """The run went through ``expected`` states.

    ``expected`` as a list: every state in order (the default, or ``exact=True``), or in
    order with gaps allowed (``exact=False``). As a string in the notation the demo prints
    (``"deciding → validating → (executing → retry_wait) ×2 → executing → observing →
    deciding → validating → done"``): compared with the path with consecutive repeats
    written once, as the demo prints it; ``exact=True`` compares it with the full path
    instead, ``exact=False`` looks for it in order, gaps allowed, in the collapsed path.
    """
    __tracebackhide__ = True
    actual = _states(result)
    if isinstance(expected, str):
        wanted = parse_path(expected)
        if exact is not True:
            actual = collapsed(actual)
        exact = exact is not False
    else:
        wanted = list(expected)
        exact = exact is not False
    if exact:
        if actual == wanted:
            return
        step = next(
            (i for i, (a, w) in enumerate(zip(actual, wanted, strict=False)) if a != w),
            min(len(actual), len(wanted)),
        )
        got = actual[step] if step < len(actual) else "(path ended)"
        want = wanted[step] if step < len(wanted) else "(path ended)"
        raise AssertionError(
            f"path differs at step {step}: expected {want!r}, got {got!r}\n"
            f"  expected: {_numbered(wanted)}\n"
            f"  actual:   {_numbered(actual)}"
        )
    at = 0
    for matched, state in enumerate(wanted):
        try:
            at = actual.index(state, at) + 1
        except ValueError:
            raise AssertionError(
                f"path does not contain the expected states in order: matched "
                f"{wanted[:matched]} then found no {state!r} after step {at - 1}\n"
                f"  expected (in order): {' -> '.join(wanted)}\n"
                f"  actual:              {_numbered(actual)}"
            ) from None


def assert_stopped(result: Any, status: str, reason: str | None = None) -> None:
    """The run ended in terminal state ``status`` (and with ``reason``, when given)."""
    __tracebackhide__ = True
    if result.status == status and (reason is None or result.reason == reason):
        return
    want = status if reason is None else f"{status}/{reason}"
    detail = f" ({result.detail})" if getattr(result, "detail", "") else ""
    raise AssertionError(
        f"run stopped as {result.status}/{result.reason}{detail}, expected {want}\n"
        f"  path: {' -> '.join(_states(result))}"
    )


def assert_history_valid(messages: Sequence[Mapping[str, Any]] | Any) -> None:
    """Every tool call is answered exactly once and no tool message is an orphan
    (what a Chat Completions provider requires). Takes messages or a result."""
    __tracebackhide__ = True
    if hasattr(messages, "messages"):
        messages = messages.messages
    problems = check_history([dict(m) for m in messages])
    if problems:
        raise AssertionError("history is not provider-valid:\n  " + "\n  ".join(problems))


def assert_trace_legal(result: _HasEvents | Sequence[Mapping[str, Any]]) -> None:
    """The events form a legal trace of the machine: the one checker
    (``fsm_agent._trace.checker``, what ``fsm-agent check`` runs) finds no violation."""
    __tracebackhide__ = True
    events = result if isinstance(result, Sequence) else result.events
    problems = [
        f"event line {v.line}: {v.message}" for v in check_events([dict(e) for e in events])
    ]
    if problems:
        raise AssertionError(
            "trace is not a legal path of the machine:\n  " + "\n  ".join(problems)
        )


_Source = (
    FaultyTool | FaultyTools | Ledger | AgentUnderTest | _HasEvents | Sequence[Mapping[str, Any]]
)


def duplicate_writes(*sources: _Source) -> list[str]:
    """Writes that happened twice; see :func:`assert_no_duplicate_writes`."""
    problems: list[str] = []
    for source in sources:
        if isinstance(source, AgentUnderTest):
            source = source.ledger
        if isinstance(source, Ledger):
            problems += source.duplicate_writes()
        elif isinstance(source, (FaultyTool, FaultyTools)):
            tools = [source] if isinstance(source, FaultyTool) else list(source.tools.values())
            for tool in tools:
                counts = Counter(
                    e.key for e in tool.effects if e.key is not None and not e.deduplicated
                )
                problems += [
                    f"{tool.name}: key {key!r} took effect {n} times"
                    for key, n in counts.items()
                    if n > 1
                ]
        else:
            events = source if isinstance(source, Sequence) else source.events
            problems += _repeated_write_attempts(events)
    return problems


def assert_no_duplicate_writes(*sources: _Source) -> None:
    """No write took effect twice.

    For an :class:`~fsm_agent.testing._agent.AgentUnderTest` (or its
    :class:`~fsm_agent.testing._agent.Ledger`) this reads what really reached the tools:
    a write may take effect at most once per key (its idempotency key, else its
    arguments), whatever the registry declares about downstream deduplication.

    For fault tools (or a whole :class:`FaultyTools` kit) this reads their side-effect
    log: an idempotency key must take effect at most once (a deduplicating downstream's
    repeats are not effects). For a result or its events it reads the trace: a write
    call must be attempted at most once unless its tool declares downstream dedup.
    """
    __tracebackhide__ = True
    problems = duplicate_writes(*sources)
    if problems:
        raise AssertionError("a write ran twice:\n  " + "\n  ".join(problems))


def _repeated_write_attempts(events: Sequence[Mapping[str, Any]]) -> list[str]:
    header = events[0] if events else {}
    tools = header.get("tools")
    problems = []
    for e in events:
        if e.get("type") != "transition" or (e.get("trigger"), e.get("dest")) != (
            "dispatch",
            "executing",
        ):
            continue
        info = tools.get(e.get("tool")) if isinstance(tools, Mapping) else None
        if not isinstance(info, Mapping) or info.get("effect") != "write" or info.get("dedup"):
            continue
        # ``attempt`` counts attempts of this call within its batch (ids may recur later).
        if e.get("attempt") != 1:
            problems.append(
                f"write {e.get('tool')!r} call {e.get('call_id')!r} was "
                f"attempted {e.get('attempt')!r} times (event {e.get('seq')})"
            )
    return problems
