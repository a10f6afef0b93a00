"""Fuzzing your agent from your own tool schemas (needs Hypothesis).

:func:`agent_runs` draws whole runs for an application: model decisions whose calls
name its tools with arguments valid for their schemas (the common JSON Schema subset,
each draw checked by the registry's own validator) or deliberately broken (unknown
fields, wrong types, duplicate keys, lone surrogates, huge and non-finite numbers,
duplicate or missing call ids, unknown tools), a fault script
per tool (:class:`~fsm_agent.testing._faults.ToolFaults`), and what a reviewer does with
a paused call. :func:`fuzz_agent` runs them through the application's own runtime
factory and checks, on every run:

- it ends in a terminal state (``review_required`` is the paused one);
- its history is one OpenAI Chat Completions accepts (``models.validate``);
- its trace is legal (the checker ``fsm-agent check`` runs);
- no write took effect twice (the :class:`~fsm_agent.testing._agent.Ledger`);
- no call a ``before_tool`` rule denied reached its tool (the ledger sees each ``rule``
  event before the batch's calls run);
- no budget was exceeded (rounds, calls, model calls).

A failure raises :class:`FuzzFailure` with the smallest run Hypothesis found, written
out as a ready pytest test.

Every seed starts with the same :func:`corpus`: each tool called once, with its simplest
valid arguments, under each fault (approved if it pauses). A bug that one fault of one
tool shows (a write registered as a read and retried after its answer was lost; a write
whose registrar falsely declares downstream dedup) is found there, in about a second,
and reported as that one-call run. Then Hypothesis draws the rest of the budget, steered
by ``target`` towards a write that ran twice and towards the rows (told apart by read
and write calls) the runs so far took least.
"""

from __future__ import annotations

import contextlib
import json
import math
import pprint
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from hypothesis import HealthCheck, example, find, given, settings, target
from hypothesis import seed as hypothesis_seed
from hypothesis import strategies as st
from hypothesis.errors import HypothesisException

from fsm_agent._core.history import check_history
from fsm_agent._core.table import TERMINAL_STATES
from fsm_agent._errors import ReviewError
from fsm_agent._trace.checker import check_events
from fsm_agent.models._scripted import ScriptedModel
from fsm_agent.models._validate import check_openai_chat
from fsm_agent.testing._agent import AgentUnderTest, RuntimeFactory
from fsm_agent.tools._registry import Tool

__all__ = [
    "FUZZ_FAULTS", "FuzzFailure", "FuzzRun", "agent_runs", "corpus", "fuzz_agent", "violations",
]  # fmt: skip

#: The faults a fuzz run injects (no crash or Ctrl-C: those end the process, not the run).
FUZZ_FAULTS: tuple[str, ...] = (
    "ok", "transient", "timeout", "rejected", "raise", "lost_response", "slow",
)  # fmt: skip


#: Faults after the effect twice as often: they are where a write can run twice.
_WEIGHTED_FAULTS: tuple[str, ...] = (*FUZZ_FAULTS, "lost_response")


class FuzzFailure(AssertionError):
    """A drawn run broke an invariant; ``test`` is the reproducing test's source."""

    def __init__(self, message: str, test: str) -> None:
        super().__init__(f"{message}\n\nA test that reproduces it:\n\n{test}")
        self.test = test


@dataclass
class FuzzRun:
    """One drawn run: the decisions in order, the faults per tool, the review answers."""

    decisions: list[Any]
    faults: dict[str, list[str]]
    #: Per pause, in order: approve (``True``) or deny (``False``) every paused call.
    reviews: list[bool] = field(default_factory=list)


def _draws(schema: Mapping[str, Any]) -> st.SearchStrategy[Any]:
    """Values of the common subset of JSON Schema tool arguments use (objects with
    properties, strings with lengths or a pattern, bounded numbers, enums, arrays)."""
    if "enum" in schema:
        return st.sampled_from(list(schema["enum"]))
    if "const" in schema:
        return st.just(schema["const"])
    kind = schema.get("type")
    if kind == "object" or "properties" in schema:
        props = schema.get("properties", {})
        required = [n for n in schema.get("required", []) if n in props]
        optional = {n: _draws(s) for n, s in props.items() if n not in required}
        return st.fixed_dictionaries({n: _draws(props[n]) for n in required}, optional=optional)
    if kind == "string":
        if "pattern" in schema:
            return st.from_regex(schema["pattern"], fullmatch=True)
        low, high = schema.get("minLength", 0), schema.get("maxLength", 40)
        return st.text(min_size=low, max_size=high)
    if kind in ("number", "integer"):
        low = schema.get("minimum", schema.get("exclusiveMinimum"))
        high = schema.get("maximum", schema.get("exclusiveMaximum"))
        if kind == "integer":
            return st.integers(min_value=low, max_value=high)
        return st.floats(
            min_value=low, max_value=high, allow_nan=False, allow_infinity=False,
            exclude_min="exclusiveMinimum" in schema, exclude_max="exclusiveMaximum" in schema,
        )  # fmt: skip
    if kind == "boolean":
        return st.booleans()
    if kind == "array":
        return st.lists(_draws(schema.get("items", {})), max_size=schema.get("maxItems", 3))
    return st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=8))


def _valid_arguments(tool: Tool) -> st.SearchStrategy[Any]:
    """Arguments the tool's own validator accepts, drawn by :func:`_draws` and filtered by
    the registry's validator, so "valid" means what the runtime will accept.
    (``hypothesis-jsonschema`` 0.23.1, its latest release, fails on every object schema
    with current Hypothesis, so the common subset is drawn here.)"""
    strategy = _draws(tool.schema)
    validator = tool.validator
    return strategy.filter(lambda v: validator is None or validator.is_valid(v))


_JUNK = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**30), max_value=10**30),
    st.sampled_from([math.inf, -math.inf, math.nan, 1e308, -1e308]),
    st.text(max_size=8),
    st.just("\ud800"),  # a lone surrogate: not encodable as UTF-8
    st.lists(st.integers(), max_size=2),
)


def _break(valid: dict[str, Any], schema: Mapping[str, Any]) -> st.SearchStrategy[Any]:
    """Arguments (a dict, or a raw JSON text) that the schema or JSON itself refuses."""
    names = sorted(schema.get("properties", {})) or ["x"]
    unknown = st.builds(lambda v, j: {**v, "unexpected_field": j}, st.just(valid), _JUNK)
    wrong = st.builds(lambda n, j: {**valid, n: j}, st.sampled_from(names), _JUNK)
    missing = st.sampled_from(names).map(lambda n: {k: v for k, v in valid.items() if k != n})
    duplicate = st.sampled_from(names).map(
        lambda n: "{" + f'"{n}": 1, "{n}": "2"' + "}"  # duplicate keys in the JSON text
    )
    raw = st.sampled_from(["", "{", "[]", "null", '{"a": NaN}', "1e999999"])
    return st.one_of(unknown, wrong, missing, duplicate, raw)


@st.composite
def _arguments(draw: st.DrawFn, tool: Tool) -> Any:
    # Mostly valid: a call has to run before a fault can make it run twice. Drawn step by
    # step (no flatmap), so the shrinker can simplify each part on its own.
    valid = draw(_valid_arguments(tool))
    if isinstance(valid, dict) and draw(st.integers(0, 3)) == 0:
        return draw(_break(valid, tool.schema))
    return valid


def _json_text(arguments: Any) -> str:
    if isinstance(arguments, str):
        return arguments
    return json.dumps(arguments, allow_nan=True, ensure_ascii=True)


@st.composite
def _call(draw: st.DrawFn, tools: Sequence[Tool]) -> tuple[str, str]:
    # Writes twice as often as reads: they are where the invariants bite.
    if not tools or draw(st.integers(0, 7)) == 0:
        return ("no_such_tool", "{}")
    weighted = [t for t in tools for _ in range(2 if t.effect == "write" else 1)]
    tool = draw(st.sampled_from(weighted))
    return (tool.name, _json_text(draw(_arguments(tool))))


@st.composite
def _decision(draw: st.DrawFn, tools: Sequence[Tool], round_no: int) -> Any:
    # Weighted towards runs that get somewhere: a broken decision ends the run at once.
    if draw(st.integers(0, 5)) == 0:
        return {"role": "assistant", "content": draw(st.sampled_from(["Done.", "", None]))}
    calls = draw(st.lists(_call(tools), min_size=1, max_size=3))
    pick = draw(st.integers(0, 5)) if len(calls) > 1 else 5
    ids = "duplicate" if pick == 0 else "missing" if pick == 1 else "fresh"
    out = []
    for n, (name, text) in enumerate(calls, 1):
        call: dict[str, Any] = {"type": "function", "function": {"name": name, "arguments": text}}
        if ids == "fresh":
            call["id"] = f"r{round_no}c{n}"
        elif ids == "duplicate":
            call["id"] = f"r{round_no}c1"
        elif n > 1:
            call["id"] = None
        else:
            call["id"] = f"r{round_no}c1"
        out.append(call)
    return {"role": "assistant", "content": None, "tool_calls": out}


def agent_runs(tools: Sequence[Tool], *, max_rounds: int = 4) -> st.SearchStrategy[FuzzRun]:
    """Runs over ``tools`` (the application's registered tools)."""
    names = [t.name for t in tools]

    @st.composite
    def run(draw: st.DrawFn) -> FuzzRun:
        n = draw(st.integers(1, max_rounds))
        decisions = [draw(_decision(tools, i)) for i in range(1, n + 1)]
        decisions.append({"role": "assistant", "content": "Done."})
        scripts = draw(
            st.fixed_dictionaries(
                {n: st.lists(st.sampled_from(_WEIGHTED_FAULTS), max_size=3) for n in names}
            )
        )
        faults = {tool: script for tool, script in scripts.items() if script}
        # Mostly approve: what an approval lets run is where writes can go wrong.
        reviews = draw(st.lists(st.sampled_from([True, True, False]), min_size=1, max_size=3))
        return FuzzRun(decisions, faults, reviews)

    return run()


def _simplest(tool: Tool) -> Any:
    """The simplest arguments the tool accepts (what Hypothesis shrinks a valid draw to),
    or ``None`` when its schema admits none the drawer can find."""
    quiet = settings(
        database=None, max_examples=200, deadline=None, suppress_health_check=list(HealthCheck)
    )
    try:
        return find(_valid_arguments(tool), lambda _: True, settings=quiet)
    except HypothesisException:
        return None


def corpus(tools: Sequence[Tool]) -> list[FuzzRun]:
    """One small run per tool and fault: the tool called once with its simplest valid
    arguments, that fault on its first call, an approval if it pauses. Every seed runs
    them first, so a bug one fault of one tool shows is found whatever the seed, and
    reported as this run, already minimal."""
    runs = []
    for tool in tools:
        arguments = _simplest(tool)
        if arguments is None:
            continue
        call = {"id": "r1c1", "type": "function",
                "function": {"name": tool.name, "arguments": _json_text(arguments)}}  # fmt: skip
        decisions: list[Any] = [
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "assistant", "content": "Done."},
        ]
        runs += [FuzzRun(list(decisions), {tool.name: [f]}, [True]) for f in FUZZ_FAULTS]
    return runs


def _rows(result: Any, writes: set[str]) -> set[tuple[str, ...]]:
    """The rows a run took, told apart by whether the call's tool writes (a retry of a
    read and a retry of a write are one row, and only the second one is news)."""
    return {
        (e["trigger"], e["source"], e["dest"], "write" if e.get("tool") in writes else "")
        for e in result.events
        if e.get("type") == "transition"
    }


def violations(agent: AgentUnderTest, result: Any) -> list[str]:
    """The invariants ``result`` (the run's end, after its reviews) breaks."""
    problems: list[str] = []
    if result.status not in TERMINAL_STATES:
        problems.append(f"the run ended in {result.status!r}, not a terminal state")
    sent = result.messages
    if result.status == "protocol_error" and sent and sent[-1].get("role") == "assistant":
        # The refused decision is kept as evidence; what a next request sends is the rest.
        sent = sent[:-1]
    problems += [f"history: {p}" for p in check_openai_chat(sent)]
    problems += [f"history: {p}" for p in check_history(result.messages)]
    problems += [f"trace line {v.line}: {v.message}" for v in check_events(result.events)]
    problems += agent.ledger.duplicate_writes()
    problems += agent.ledger.denied_but_ran()
    runtime = agent.runtime
    if runtime is not None:
        budget, counters = runtime.budget, result.counters
        for counter, limit in (
            ("tool_rounds", budget.max_tool_rounds),
            ("total_calls", budget.max_total_calls),
            ("model_calls", budget.max_model_calls),
        ):
            if isinstance(counters.get(counter), int) and counters[counter] > limit:
                problems.append(f"budget: {counter} = {counters[counter]} > {limit}")
    return problems


def _drive(agent: AgentUnderTest, run: FuzzRun, task: str) -> Any:
    result = agent.run(task, model=ScriptedModel(list(run.decisions)))
    for approve in run.reviews:
        if result.status != "review_required" or not result.pending:
            break
        run_id = result.run_id
        for call_id in list(result.pending):
            # A decision that does not fit a call (approve for a lost write, any for a
            # call merely skipped behind a paused one) is refused: the reviewer moves on.
            with contextlib.suppress(ReviewError):
                if approve:
                    agent.approve(run_id, call_id, by="fuzz")
                else:
                    agent.deny(run_id, call_id, "denied by the fuzz run", by="fuzz")
        result = agent.resume(run_id)
    return result


def _reproduction(
    factory: RuntimeFactory, run: FuzzRun, task: str, writes: Any, problems: list[str]
) -> str:
    where = f"{factory.__module__}.{factory.__qualname__}"
    module, _, name = where.rpartition(".")
    lines = [
        f"from {module} import {name}",
        "from fsm_agent.testing import AgentUnderTest, ScriptedModel",
        "from fsm_agent.testing._fuzz import FuzzRun, replay",
        "",
        "",
        "def test_fuzz_reproduction():",
        f"    # Found by fuzz_agent: {problems[0]}",
        "    run = FuzzRun(",
        "        decisions="
        + pprint.pformat(run.decisions, width=80, sort_dicts=False).replace("\n", "\n        ")
        + ",",
        f"        faults={run.faults!r},",
        f"        reviews={run.reviews!r},",
        "    )",
        f"    agent = AgentUnderTest({name}, faults=run.faults, writes={writes!r})",
        f"    assert replay(agent, run, task={task!r}) == []",
    ]
    return "\n".join(lines)


def _indented(text: str) -> str:
    return text.replace("\n", "\n        ") + ","


def replay(agent: AgentUnderTest, run: FuzzRun, *, task: str = "Help the customer.") -> list[str]:
    """Drive ``run`` through ``agent`` (built with ``run.faults``) and return the broken
    invariants (what a printed reproduction asserts is empty)."""
    return violations(agent, _drive(agent, run, task))


def _steer(
    agent: AgentUnderTest, result: Any, writing: set[str], seen: Counter[tuple[str, ...]]
) -> None:
    """Steer the search towards one write running again (the duplicate-write bugs) and
    towards the rows, told apart by reads and writes, the runs so far took least."""
    writes = Counter(e.identity for e in agent.ledger.executed() if e.tool in writing)
    target(float(max(writes.values(), default=0)), label="most runs of one write")
    rows = _rows(result, writing)
    target(sum(1.0 / (1 + seen[row]) for row in rows), label="rarely taken rows")
    seen.update(rows)


def fuzz_agent(
    factory: RuntimeFactory,
    *,
    task: str = "Help the customer.",
    writes: Iterable[str] | None = None,
    max_examples: int = 300,
    max_rounds: int = 4,
    seed: int | None = None,
    use_corpus: bool = True,
    **options: Any,
) -> None:
    """Draw ``max_examples`` runs of the application ``factory`` builds and check the
    invariants on each (see the module docstring); raises :class:`FuzzFailure` with a
    reproducing test for the smallest failing run. ``writes`` states which tools write
    (default: what the registry declares); ``options`` go to the factory.

    The first runs of the budget are the :func:`corpus` (one call of each tool with each
    fault, unless ``use_corpus=False``), the same for every seed; the drawn ones are
    steered towards a write running twice and towards the rows taken least so far."""
    write_list = sorted(writes) if writes is not None else None
    probe = AgentUnderTest(factory, **options).build(ScriptedModel([]))
    tools = list(probe.tools)
    writing = set(write_list) if write_list is not None else {
        t.name for t in tools if t.effect == "write"
    }  # fmt: skip
    failure: list[tuple[FuzzRun, list[str]]] = []
    seeds = corpus(tools)[:max_examples] if use_corpus else []
    seen: Counter[tuple[str, ...]] = Counter()

    @settings(
        max_examples=max(1, max_examples - len(seeds)),
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(agent_runs(tools, max_rounds=max_rounds))
    def check(run: FuzzRun) -> None:
        agent = AgentUnderTest(factory, faults=run.faults, writes=write_list, **options)
        result = _drive(agent, run, task)
        problems = violations(agent, result)
        _steer(agent, result, writing, seen)
        if problems:
            failure.append((run, problems))
            raise AssertionError("; ".join(problems))

    for run in reversed(seeds):  # (decorators apply inside out: keep the corpus order)
        check = example(run)(check)
    if seed is not None:
        check = hypothesis_seed(seed)(check)
    try:
        check()
    except AssertionError:
        if not failure:
            raise
        # Hypothesis replays the smallest failing example last.
        run, problems = failure[-1]
        message = "fuzz_agent: a run broke an invariant:\n  " + "\n  ".join(problems)
        raise FuzzFailure(
            message, _reproduction(factory, run, task, write_list, problems)
        ) from None
