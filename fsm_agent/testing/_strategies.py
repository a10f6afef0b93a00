"""Hypothesis strategies for fuzzing runs, and the invariants every run must keep.

``cases()`` draws a whole :class:`FuzzCase`: fault tools (read/write, idempotent,
dedup, needing approval, each with a script of behaviours), the trusted configuration
(allowed tools, approvals, budget, retry policy, policy) and one or two scripts of model
steps (runs share one idempotency store, so a write that crashed in the first run meets
its record in the second). Decisions range from valid batches to malformed ones: ids
missing, empty, duplicate, unicode or not strings; names known, unknown or not allowed;
arguments valid, invalid JSON, with duplicate keys, NaN, huge numbers, deep nesting or
wrong types. :func:`run_case` runs it on a fake clock and :func:`invariant_problems`
lists every broken invariant::

    @given(cases())
    def test_invariants(case):
        assert invariant_problems(run_case(case)) == []

Importing this module needs Hypothesis (a ``dev`` extra); the rest of the toolkit does not.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from typing import Any

from hypothesis import strategies as st

from fsm_agent._core.approvals import Approval
from fsm_agent._core.budget import Budget, RetryPolicy
from fsm_agent._core.canonical import digest
from fsm_agent._core.history import check_history
from fsm_agent._core.table import TERMINAL_STATES
from fsm_agent._durable.memory import MemoryStore
from fsm_agent._runtime.result import RunResult
from fsm_agent._trace.checker import check_events
from fsm_agent.models._scripted import ScriptedModel, Step
from fsm_agent.testing._assertions import duplicate_writes
from fsm_agent.testing._faults import BEHAVIOURS, KEY_SCHEMA, FaultyTools
from fsm_agent.testing._scenarios import TICKET_SCHEMA, run_through_interrupts, scripted_runtime

__all__ = [
    "TOOL_NAMES",
    "FuzzCase",
    "FuzzOutcome",
    "ModelStep",
    "ToolConfig",
    "arguments",
    "budgets",
    "cases",
    "decisions",
    "hostile_replies",
    "hostile_text",
    "hostile_values",
    "invariant_problems",
    "run_case",
    "tool_behaviours",
]


class Unprintable:
    """An object whose ``str()`` and ``repr()`` raise (as some tool results do)."""

    def __str__(self) -> str:
        raise RuntimeError("__str__ raised")

    def __repr__(self) -> str:
        raise RuntimeError("__repr__ raised")


def _deep(depth: int) -> Any:
    value: Any = "bottom"
    for n in range(depth):
        value = [value] if n % 2 else {"d": value}
    return value


def _cycle() -> Any:
    loop: list[Any] = ["loop"]
    loop.append(loop)
    return loop


#: Text with what UTF-8 cannot hold: lone surrogates (also as they come out of
#: ``os.listdir`` for a file name that is not UTF-8, ``\udcff``).
_LONE = st.sampled_from(["\ud800", "\udfff", "\udcff", "a\ud83d", "\ud83d\ude00"])


def hostile_text() -> st.SearchStrategy[str]:
    """Text, often with a lone surrogate in it."""
    return st.one_of(st.text(max_size=12), st.builds(lambda a, b, c: a + b + c,
                                                     st.text(max_size=4), _LONE,
                                                     st.text(max_size=4)))  # fmt: skip


_HOSTILE_LEAVES: st.SearchStrategy[Any] = st.one_of(
    st.none(), st.booleans(), st.integers(), hostile_text(),
    st.floats(allow_nan=True, allow_infinity=True),
    # (Built, not listed: Hypothesis shows a strategy's elements with repr(), which
    # refuses ints past 4,300 digits.)
    st.builds(lambda digits: 10**digits, st.sampled_from([19, 4400, 5000])),
    st.sampled_from([float("inf"), float("-inf"), float("nan")]),
    st.binary(max_size=8),
    st.builds(Unprintable), st.builds(object), st.just(ValueError("boom")),
    st.sampled_from([_deep(150), _deep(1200)]), st.builds(_cycle),
)  # fmt: skip


def hostile_values() -> st.SearchStrategy[Any]:
    """Anything a tool (or a careless adapter) may hand back: JSON-like trees with lone
    surrogates, NaN and infinities, integers past Python's 4,300-digit ``str()`` limit,
    nesting past the recursion limit, bytes, cycles, and objects whose ``str()`` and
    ``repr()`` raise."""
    return st.recursive(
        _HOSTILE_LEAVES,
        lambda inner: (
            st.lists(inner, max_size=3)
            | st.dictionaries(st.one_of(hostile_text(), st.integers()), inner, max_size=3)
        ),
        max_leaves=8,
    )


@st.composite
def hostile_replies(draw: st.DrawFn) -> Any:
    """A model reply with hostile bytes where providers put text and numbers: content,
    arguments (as text and as a JSON escape), ids, names, extra keys, usage."""
    value = draw(st.one_of(hostile_values(), hostile_text()))
    arguments = draw(st.one_of(
        st.builds(lambda t: json.dumps({"key": t}, ensure_ascii=False), hostile_text()),
        st.builds(lambda t: json.dumps({"key": t}), hostile_text()),  # as \u escapes
        st.sampled_from(["1e400", "9" * 5000, "[" * 3000 + "]" * 3000]).map(
            lambda number: '{"key": ' + number + "}"),
    ))  # fmt: skip
    call = {"id": draw(hostile_text()), "type": "function",
            "function": {"name": draw(st.sampled_from(["lookup", "lookup\ud800"])),
                         "arguments": arguments}}  # fmt: skip
    reply: dict[str, Any] = {"role": "assistant", "content": draw(st.none() | hostile_text())}
    if draw(st.booleans()):
        reply["tool_calls"] = [call]
    if draw(st.booleans()):
        reply["reasoning"] = value
    if draw(st.booleans()):
        reply["usage"] = draw(st.one_of(hostile_values(), st.fixed_dictionaries(
            {"prompt_tokens": _HOSTILE_LEAVES, "completion_tokens": _HOSTILE_LEAVES,
             "cost": _HOSTILE_LEAVES})))  # fmt: skip
    return reply


KEYS = ("K1", "K2", "A17")
TITLES = ("refund", "réembolso ✓")
UNKNOWN_NAMES = ("delete_everything", "lookup ", "LOOKUP", "ti\u0000cket", "工具")


@dataclass(frozen=True)
class ToolConfig:
    """One fault tool of a case: what its registrar declares and how it will behave."""

    name: str
    effect: str
    faults: tuple[str, ...] = ()
    idempotent: bool = False
    dedup: bool = False
    requires_approval: bool = False


@dataclass(frozen=True)
class ModelStep:
    """A model step: a reply (any value), or ``raise_error``, or ``interrupt`` (Ctrl-C
    while the model is thinking); ``delay_s`` moves the fake clock first (a slow model)."""

    reply: Any = None
    raise_error: bool = False
    delay_s: float = 0.0
    interrupt: bool = False


@dataclass
class FuzzCase:
    tools: list[ToolConfig]
    allowed: list[str]
    approvals: list[tuple[str, dict[str, Any]]]
    budget: Budget
    retry: RetryPolicy
    policy: str
    scripts: list[list[ModelStep]]
    use_async: bool = False


@dataclass
class FuzzOutcome:
    case: FuzzCase
    kit: FaultyTools
    results: list[RunResult] = field(default_factory=list)
    models: list[ScriptedModel] = field(default_factory=list)


# ── tools and trusted configuration ──────────────────────────────────────────────────


def _weighted(*options: tuple[int, st.SearchStrategy[Any]]) -> st.SearchStrategy[Any]:
    """Choose among strategies in proportion to their weights (``one_of`` picks branches
    evenly and merges equal ones, which would make most batches malformed and the
    interesting paths rare). Build these once: a composite costs much to create."""
    total = sum(w for w, _ in options)

    @st.composite
    def pick(draw: st.DrawFn) -> Any:
        n = draw(st.integers(0, total - 1))
        for weight, strategy in options:
            if n < weight:
                return draw(strategy)
            n -= weight
        raise AssertionError("unreachable")

    return pick()


_BEHAVIOUR = _weighted((1, st.just("ok")), (1, st.sampled_from(BEHAVIOURS)))


def tool_behaviours(max_size: int = 4) -> st.SearchStrategy[tuple[str, ...]]:
    """Scripts of tool behaviours: ok, transient, unknown-outcome errors, rejections,
    timeouts on the fake clock, oversized and hostile output (about half are ``ok``)."""
    return st.lists(_BEHAVIOUR, max_size=max_size).map(tuple)


_BEHAVIOURS = tool_behaviours()


@st.composite
def _tool_configs(draw: st.DrawFn) -> list[ToolConfig]:
    tools = [ToolConfig("lookup", "read", draw(_BEHAVIOURS))]
    idempotent = draw(st.booleans())
    tools.append(
        ToolConfig(
            "create_ticket",
            "write",
            draw(_BEHAVIOURS),
            idempotent=idempotent,
            dedup=idempotent and draw(st.booleans()),
            requires_approval=draw(st.integers(0, 2)) == 0,
        )
    )
    if draw(st.booleans()):
        tools.append(ToolConfig("send_email", "write", draw(_BEHAVIOURS)))
    return tools


def budgets() -> st.SearchStrategy[Budget]:
    """Small budgets, so that every limit is reached often."""
    return st.builds(
        Budget,
        max_tool_rounds=st.integers(1, 4),
        max_calls_per_round=st.integers(1, 4),
        max_total_calls=st.integers(1, 8),
        max_model_calls=st.integers(1, 6),
        max_tokens=_weighted((3, st.none()), (1, st.integers(1, 400))),
        max_cost=_weighted((3, st.none()), (1, st.floats(0, 1, allow_nan=False))),
        max_wall_clock_s=st.none() | st.floats(1, 100, allow_nan=False),
        max_output_bytes=st.none() | st.integers(50, 20_000),
    )


_RETRIES = st.builds(
    RetryPolicy, max_attempts=st.integers(1, 4), backoff_s=st.sampled_from([0.0, 0.05, 1.0, 30.0])
)


# ── decisions ───────────────────────────────────────────────────────────────────────

_VALID_ARGUMENTS: dict[str, st.SearchStrategy[dict[str, Any]]] = {
    "lookup": st.fixed_dictionaries({"key": st.sampled_from(KEYS)}),
    "write": st.fixed_dictionaries(
        {"key": st.sampled_from(KEYS)}, optional={"title": st.sampled_from(TITLES)}
    ),
}


def _valid_arguments(name: str) -> st.SearchStrategy[dict[str, Any]]:
    return _VALID_ARGUMENTS["lookup" if name == "lookup" else "write"]


_BAD_ARGUMENTS = st.one_of(
    st.sampled_from(
        [
            "",
            "{",
            "[]",
            "null",
            '"key"',
            "{'key': 'K1'}",
            '{"key": "K1", "key": "K2"}',  # duplicate keys
            '{"key": NaN}',
            '{"key": Infinity}',
            '{"key": -Infinity}',
            '{"key": 1e999}',
            '{"key": ' + "9" * 5000 + "}",  # huge numbers
            "[" * 5_000 + "]" * 5_000,  # nesting past the recursion limit
            '{"key": 5}',
            '{"key": true}',
            '{"key": null}',
            '{"key": ["K1"]}',  # wrong types
            '{"key": ""}',
            '{"key": "' + "k" * 100 + '"}',  # schema bounds
            '{"key": "K1", "approved": true}',  # an unknown field grants nothing
            '{"key": "K1"} trailing',
        ]
    ),
    st.text(max_size=30),
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(max_size=5),
        lambda inner: (
            st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
        ),
        max_leaves=10,
    ).map(json.dumps),
)


def _arguments_of(valid: st.SearchStrategy[dict[str, Any]]) -> st.SearchStrategy[Any]:
    as_text = st.one_of(
        valid.map(json.dumps), valid.map(lambda a: json.dumps(a, ensure_ascii=False, indent=1))
    )
    not_text = st.sampled_from([{"key": "K1"}, None, 7])
    return _weighted((40, as_text), (9, _BAD_ARGUMENTS), (1, not_text))


_ARGUMENTS = {kind: _arguments_of(valid) for kind, valid in _VALID_ARGUMENTS.items()}


def arguments(name: str) -> st.SearchStrategy[Any]:
    """A call's ``arguments``: mostly valid JSON text for ``name``, else anything hostile
    (including non-strings, which make the whole decision malformed)."""
    return _ARGUMENTS["lookup" if name == "lookup" else "write"]


TOOL_NAMES = ("lookup", "create_ticket", "send_email")
_NAMES = _weighted(
    (76, st.sampled_from(TOOL_NAMES)),
    (2, st.sampled_from(UNKNOWN_NAMES)),
    (1, st.just("")),
    (1, st.integers()),
)
_ODD_IDS = st.one_of(
    st.none(), st.just(""), st.just("c1"), st.text(max_size=8), st.integers(), st.just("🔑-id")
)
_ODD_CALLS: st.SearchStrategy[Any] = st.sampled_from([None, "call", [], {"function": None}])


@st.composite
def _call(draw: st.DrawFn, index: int) -> Any:
    name = draw(_NAMES)
    call: dict[str, Any] = {
        "type": "function",
        "function": {"name": name, "arguments": draw(arguments(str(name)))},
    }
    if draw(st.integers(0, 9)) == 0:
        call["id"] = draw(_ODD_IDS)
    elif draw(st.integers(0, 19)) != 0:  # otherwise the id is left out altogether
        call["id"] = f"c{index}"  # ids restart per batch, as many providers' do
    if draw(st.integers(0, 79)) == 0:
        call["type"] = draw(st.sampled_from(["tool", None, 1]))
    if draw(st.integers(0, 99)) == 0:
        return draw(_ODD_CALLS)
    return call


_USAGE = _weighted(
    (10, st.none()),
    (
        4,
        st.fixed_dictionaries(
            {"prompt_tokens": st.integers(0, 200), "completion_tokens": st.integers(0, 200)},
            optional={"cost": st.floats(0, 0.5, allow_nan=False)},
        ),
    ),
    (
        1,
        st.fixed_dictionaries(
            {
                "total_tokens": st.integers(-5, 300) | st.just(True),
                "cost": st.just("free") | st.just(-1) | st.floats(),
            }
        ),
    ),
)
_ODD_REPLIES: st.SearchStrategy[Any] = st.sampled_from(
    [
        None,
        "just text",
        [],
        42,
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": 7},
        {"role": "assistant", "content": None, "tool_calls": {}},
    ]
)
_ANSWERS = _weighted(
    (6, st.sampled_from(["Done.", "完成 ✓", "\u0000", "A17 is in transit."])),
    (2, st.text(max_size=20)),
    (1, st.sampled_from(["", " "])),
)
_BATCH_SIZES = _weighted((1, st.just(0)), (12, st.integers(1, 2)), (3, st.integers(3, 5)))


@st.composite
def _decision(draw: st.DrawFn) -> Any:
    shape = draw(st.integers(0, 39))
    if shape == 0:
        return draw(_ODD_REPLIES)
    message: dict[str, Any] = {"role": "assistant"}
    if shape <= 11:  # an answer, perhaps empty
        message["content"] = draw(_ANSWERS)
    else:
        message["content"] = draw(st.none() | st.just("Let me check."))
        message["tool_calls"] = [draw(_call(i + 1)) for i in range(draw(_BATCH_SIZES))]
    usage = draw(_USAGE)
    if usage is not None:
        message["usage"] = usage
    return message


_DECISIONS = _decision()


def decisions() -> st.SearchStrategy[Any]:
    """A model reply: usually an assistant message with a batch of calls (to
    ``lookup``, ``create_ticket``, ``send_email`` or unknown tools) or an answer,
    sometimes malformed in any of the ways a model or a proxy gets it wrong."""
    return _DECISIONS


_DELAYS = st.sampled_from([0.0, 0.0, 0.0, 3.0, 50.0])


@st.composite
def _model_steps(draw: st.DrawFn) -> list[ModelStep]:
    steps = []
    for _ in range(draw(st.integers(1, 6))):
        delay = draw(_DELAYS)
        kind = draw(st.integers(0, 49))
        if kind <= 1:
            steps.append(ModelStep(raise_error=True, delay_s=delay))
        elif kind == 2:
            steps.append(ModelStep(interrupt=True, delay_s=delay))
        else:
            steps.append(ModelStep(draw(_DECISIONS), delay_s=delay))
    return steps


_SCRIPTS = _model_steps()
_BUDGETS = budgets()


@st.composite
def _cases(draw: st.DrawFn) -> FuzzCase:
    tools = draw(_tool_configs())
    names = [t.name for t in tools]
    allowed = (
        draw(st.lists(st.sampled_from(names), unique=True))
        if draw(st.integers(0, 4)) == 0
        else names
    )
    approvals = []
    for t in tools:
        if t.requires_approval:
            for args in draw(st.lists(_valid_arguments(t.name), max_size=3)):
                approvals.append((t.name, args))
    case = FuzzCase(
        tools=tools,
        allowed=allowed,
        approvals=approvals,
        budget=draw(_BUDGETS),
        retry=draw(_RETRIES),
        policy=draw(st.sampled_from(["default", "strict"])),
        scripts=[draw(_SCRIPTS) for _ in range(draw(st.integers(1, 2)))],
        use_async=draw(st.integers(0, 9)) == 0,
    )
    return _without_interrupts(case) if case.use_async else case


def _without_interrupts(case: FuzzCase) -> FuzzCase:
    """Ctrl-C reaches an event loop as a cancelled task, never as a ``KeyboardInterrupt``
    raised by a tool in a worker thread or by a model inside a task; an async case keeps
    its other faults and drops those it could not meet."""
    calm = [
        replace(t, faults=tuple(f for f in t.faults if not f.startswith("interrupt")))
        for t in case.tools
    ]
    scripts = [
        [replace(s, interrupt=False, raise_error=s.raise_error or s.interrupt) for s in script]
        for script in case.scripts
    ]
    return replace(case, tools=calm, scripts=scripts)


_CASES = _cases()


def cases() -> st.SearchStrategy[FuzzCase]:
    """A whole fuzz case (see the module docstring)."""
    return _CASES


# ── running a case and checking it ──────────────────────────────────────────────────


def _step(kit: FaultyTools, spec: ModelStep) -> Step:
    def step(messages: list[dict[str, Any]]) -> Any:
        kit.clock.advance(spec.delay_s)
        if spec.raise_error:
            raise ConnectionError("model endpoint reset")
        if spec.interrupt:
            raise KeyboardInterrupt
        return spec.reply

    return step


def run_case(case: FuzzCase) -> FuzzOutcome:
    """Run every script of ``case`` on one kit, one fake clock and one store."""
    kit = FaultyTools()
    for t in case.tools:
        if t.effect == "read":
            kit.read(t.name, faults=t.faults, oversized_bytes=3000, schema=KEY_SCHEMA)
        else:
            kit.write(
                t.name,
                faults=t.faults,
                schema=TICKET_SCHEMA,
                idempotent=t.idempotent,
                dedup=t.dedup,
                requires_approval=t.requires_approval,
                oversized_bytes=3000,
            )
    outcome = FuzzOutcome(case, kit)
    store = MemoryStore()
    approvals = [Approval(name, args) for name, args in case.approvals]
    for n, script in enumerate(case.scripts, 1):
        runtime = scripted_runtime(
            kit,
            [_step(kit, s) for s in script],
            allowed_tools=case.allowed,
            store=store,
            budget=case.budget,
            retry=case.retry,
            policy=case.policy,
            approvals=approvals,
        )
        model = runtime.model
        assert isinstance(model, ScriptedModel)
        outcome.models.append(model)
        result, _ = run_through_interrupts(
            runtime, "Help with A17.", run_id=f"fuzz-{n}", use_async=case.use_async
        )
        outcome.results.append(result)
    return outcome


def invariant_problems(outcome: FuzzOutcome) -> list[str]:  # noqa: C901 - one check per run invariant
    """Every invariant the case's runs broke (empty when all held)."""
    case, kit = outcome.case, outcome.kit
    b = case.budget
    problems: list[str] = []
    for n, (result, model) in enumerate(zip(outcome.results, outcome.models, strict=True), 1):
        at = f"run {n}"
        if result.status not in TERMINAL_STATES:
            problems.append(f"{at}: ended in non-terminal state {result.status!r}")
        problems += [
            f"{at}: trace: line {v.line}: {v.message}" for v in check_events(result.events)
        ]
        problems += [f"{at}: returned history: {p}" for p in check_history(result.messages)]
        for i, seen in enumerate(model.seen, 1):
            problems += [f"{at}: history given to model call {i}: {p}" for p in check_history(seen)]
        c = result.counters
        for name, used, limit in (
            ("model calls", c["model_calls"], b.max_model_calls),
            ("tool rounds", c["tool_rounds"], b.max_tool_rounds),
            ("tool calls", c["tool_calls"], b.max_total_calls),
        ):
            if used > limit:
                problems.append(f"{at}: {used} {name}, over the budget of {limit}")
        for e in result.events:
            if e["type"] != "transition" or (e["trigger"], e["dest"]) != ("dispatch", "executing"):
                continue
            if e["attempt"] > case.retry.max_attempts:
                problems.append(
                    f"{at}: call {e['call_id']!r} attempt {e['attempt']} is past "
                    f"max_attempts={case.retry.max_attempts}"
                )
            if b.max_wall_clock_s is not None and e["t"] >= b.max_wall_clock_s:
                problems.append(
                    f"{at}: a tool started at t={e['t']}s, past the wall-clock "
                    f"budget of {b.max_wall_clock_s}s"
                )
        problems += [f"{at}: {p}" for p in duplicate_writes(result)]
    problems += duplicate_writes(kit)
    approved = {digest(name, args) for name, args in case.approvals}
    for t in case.tools:
        tool = kit[t.name]
        if tool.calls and t.name not in case.allowed:
            problems.append(f"{t.name} ran {tool.attempts} times but is not in allowed_tools")
        if t.requires_approval:
            problems += [
                f"{t.name} ran with {args} without a matching approval"
                for args in tool.calls
                if digest(t.name, args) not in approved
            ]
    return problems
