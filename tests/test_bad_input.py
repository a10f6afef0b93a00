"""Bad input of every kind ends in a defined state with a precise reason, or a clear
ValueError at construction; nothing raises out of run()."""

from __future__ import annotations

import json
from typing import Any

import pytest
from conftest import Backend, Budget, RetryPolicy, assert_valid_run, call, calls, make_runtime, say

from fsm_agent import Approval, Runtime, ScriptedModel, ToolRegistry


@pytest.mark.parametrize(
    "decision, detail",
    [
        (None, "the model returned NoneType, not a message dict"),
        ("just text", "the model returned str, not a message dict"),
        (["a", "list"], "the model returned list, not a message dict"),
        ({"role": "user", "content": "hi"}, "role must be 'assistant', got 'user'"),
        ({"content": "hi"}, "role must be 'assistant', got None"),
        ({"role": "assistant", "content": 42}, "content must be a string or null, got int"),
        ({"role": "assistant", "tool_calls": "lookup"}, "tool_calls must be a list, got str"),
        ({"role": "assistant", "tool_calls": {"id": "c1"}}, "tool_calls must be a list, got dict"),
        (calls("c1"), "tool_calls[0] must be an object, got str"),
        (
            calls({"id": "c1", "type": "function"}),
            "tool_calls[0].function is missing or not an object",
        ),
        (
            calls({"id": "c1", "type": "code", "function": {"name": "lookup", "arguments": "{}"}}),
            "tool_calls[0].type must be 'function', got 'code'",
        ),
        (
            calls({"id": "c1", "function": {"name": "", "arguments": "{}"}}),
            "tool_calls[0].function.name must be a non-empty string",
        ),
        (
            calls({"id": "c1", "function": {"name": "lookup", "arguments": {"order_id": "A17"}}}),
            "tool_calls[0].function.arguments must be a JSON string, got dict",
        ),
        (
            calls({"id": 7, "function": {"name": "lookup", "arguments": "{}"}}),
            "tool_calls[0].id must be a string, got int",
        ),
    ],
)
def test_malformed_decisions_end_in_protocol_error(decision: Any, detail: str) -> None:
    b = Backend()
    result = make_runtime([decision], b).run("A17?")
    assert (result.status, result.reason, result.detail) == (
        "protocol_error",
        "malformed_decision",
        detail,
    )
    assert_valid_run(result)
    assert b.lookups == [] and b.writes == []
    assert result.events[1]["type"] == "decision"  # the bad reply is kept in the trace


def test_an_unserialisable_reply_is_recorded_as_text() -> None:
    result = make_runtime([object()]).run("A17?")
    assert result.reason == "malformed_decision"
    assert isinstance(result.events[1]["message"], str)
    json.dumps(result.events)


@pytest.mark.parametrize(
    "arguments, needle",
    [
        ('{"order_id": NaN}', "NaN is not valid JSON"),
        ('{"order_id": Infinity}', "Infinity is not valid JSON"),
        ('{"order_id": "A17", "n": -Infinity}', "-Infinity is not valid JSON"),
        ('["A17"]', "arguments must be a JSON object, got list"),
        ("", "not valid JSON"),
        ('{"order_id": true}', "True is not of type 'string'"),
        ('{"order_id": "' + "9" * 5000 + '"}', "is too long"),
        ('{"order_id": ' + "9" * 5000 + "}", "an integer of 5000 digits"),
        ('{"order_id": 1e400}', "out of range"),
        ('{"order_id": "\\ud800"}', "lone surrogate"),
        ('{"order_id": "\ud800"}', "lone surrogate"),
        ("[" * 100_000 + "]" * 100_000, "nested deeper than 100"),
        ('{"order_id": ' + "[" * 150 + "]" * 150 + "}", "nested deeper than 100"),
    ],
)
def test_hostile_arguments_are_refused_not_crashed_on(arguments: str, needle: str) -> None:
    b = Backend()
    result = make_runtime([calls(call("c1", "lookup", arguments)), say("ok")], b).run("x")
    assert_valid_run(result)
    error = json.loads(result.messages[2]["content"])
    assert error["error"] == "invalid_arguments" and needle in error["detail"], error
    assert b.lookups == []


def test_integer_schema_refuses_booleans_and_strings() -> None:
    tools = ToolRegistry()
    seen: list[int] = []
    tools.register(
        lambda n: seen.append(n),
        name="count",
        effect="read",
        schema={"type": "object", "properties": {"n": {"type": "integer"}}},
    )
    script = [
        calls(call("a", "count", n=True), call("b", "count", n="3"), call("c", "count", n=4)),
        say("ok"),
    ]
    result = Runtime(model=ScriptedModel(script), tools=tools, allowed_tools={"count"}).run("x")
    assert seen == [4]
    errors = [json.loads(m["content"]).get("error") for m in result.messages if m["role"] == "tool"]
    assert errors == ["invalid_arguments", "invalid_arguments", None]


class Boom(BaseException):
    pass


@pytest.mark.parametrize(
    "error", [ValueError("v"), RuntimeError("r"), SystemExit(3), MemoryError(), RecursionError()]
)
def test_a_tool_raising_anything_never_crashes_the_runtime(error: BaseException) -> None:
    b = Backend()
    b.fail_reads.append(error)
    result = make_runtime([calls(call("c1", "lookup", order_id="A17")), say("ok")], b).run("x")
    assert_valid_run(result)
    assert result.status == "done"
    assert json.loads(result.messages[2]["content"])["error"] == "tool_failed"


def test_unserialisable_tool_output_is_kept_as_text() -> None:
    tools = ToolRegistry()
    loop: list[Any] = []
    loop.append(loop)
    tools.register(
        lambda: {"obj": object(), "loop": loop},
        name="odd",
        effect="read",
        schema={"type": "object"},
    )
    result = Runtime(
        model=ScriptedModel([calls(call("c1", "odd")), say("ok")]),
        tools=tools,
        allowed_tools={"odd"},
    ).run("x")
    assert_valid_run(result)
    assert json.loads(result.messages[2]["content"])["ok"] is True


def test_a_model_that_runs_out_of_script_is_a_model_error() -> None:
    result = make_runtime([calls(call("c1", "lookup", order_id="A17"))]).run("x")
    assert (result.status, result.reason) == ("protocol_error", "model_error")
    assert result.detail == "IndexError: ScriptedModel has only 1 steps"
    assert_valid_run(result)


def test_an_async_model_in_sync_run_is_a_clear_error() -> None:
    async def model(messages: Any, specs: Any) -> dict[str, Any]:
        return say("hi")

    tools = Backend().registry()
    with pytest.raises(ValueError, match=r"use 'await runtime\.arun"):
        Runtime(model=model, tools=tools, allowed_tools={"lookup"}).run("x")


def test_a_model_returning_an_awaitable_in_sync_run_is_a_model_error() -> None:
    async def reply() -> dict[str, Any]:
        return say("hi")

    tools = Backend().registry()
    result = Runtime(model=lambda m, s: reply(), tools=tools, allowed_tools=()).run("x")
    assert (result.status, result.reason) == ("protocol_error", "model_error")
    assert "arun" in result.detail


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"allowed_tools": {"lookup", "nope"}}, "allowed_tools names unregistered tools: nope"),
        ({"allowed_tools": "lookup"}, "not one string"),
        ({"approvals": [Approval("ghost", {})]}, "approval for unregistered tool 'ghost'"),
        ({"approvals": [("write", {})]}, "approvals must be Approval objects"),
        ({"policy": "lenient"}, "policy must be 'default' or 'strict'"),
        ({"budget": {"max_tool_rounds": 2}}, "budget must be a Budget"),
        ({"model": "gpt"}, "model must be callable"),
        ({"tools": {}}, "tools must be a ToolRegistry"),
    ],
)
def test_a_misconfigured_runtime_raises_at_construction(
    kwargs: dict[str, Any], message: str
) -> None:
    options: dict[str, Any] = {
        "model": ScriptedModel([]),
        "tools": Backend().registry(),
        "allowed_tools": {"lookup"},
        **kwargs,
    }
    with pytest.raises(ValueError, match=message):
        Runtime(**options)


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: Budget(max_tool_rounds=-1), "Budget.max_tool_rounds must be a whole number >= 1"),
        (lambda: Budget(max_calls_per_round=0), "max_calls_per_round must be a whole number"),
        (lambda: Budget(max_tokens=True), "max_tokens must be a whole number"),
        (lambda: Budget(max_cost=-0.5), "Budget.max_cost must be a number >= 0"),
        (lambda: Budget(max_wall_clock_s=float("nan")), "max_wall_clock_s must be a number > 0"),
        (lambda: RetryPolicy(max_attempts=0), "RetryPolicy.max_attempts must be a whole number"),
        (lambda: Approval("", {}), "Approval.tool must be a tool name"),
    ],
)
def test_bad_budgets_and_policies_raise_value_error(make: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        make()


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (
            {"schema": {"type": "object", "properties": {"n": {"type": "integr"}}}},
            "schema is not valid JSON Schema at properties/n/type",
        ),
        ({"schema": {"type": "array"}}, "must have type 'object'"),
        ({"schema": {"type": "object"}, "effect": "delete"}, "effect must be 'read' or 'write'"),
        (
            {"schema": {"type": "object"}, "idempotency_key": lambda a: 1},
            "only write tools take an idempotency key",
        ),
        (
            {"schema": {"type": "object"}, "effect": "write", "dedup": True},
            "dedup=True needs an idempotency_key",
        ),
        (
            {"schema": {"type": "object"}, "requires_approval": True},
            "requires_approval is for write tools",
        ),
        ({"schema": {"type": "object"}, "timeout_s": 0}, "timeout_s must be a number > 0"),
    ],
)
def test_bad_tool_registrations_raise_value_error(kwargs: dict[str, Any], message: str) -> None:
    tools = ToolRegistry()
    options = {"effect": "read", **kwargs}
    with pytest.raises(ValueError, match=message):
        tools.register(lambda **kw: kw, name="t", **options)


def test_registering_a_name_twice_is_refused() -> None:
    tools = ToolRegistry()
    tools.register(lambda: 1, name="t", effect="read", schema={"type": "object"})
    with pytest.raises(ValueError, match="already registered"):
        tools.register(lambda: 2, name="t", effect="read", schema={"type": "object"})


def test_open_schemas_stay_open_only_when_the_registrar_says_so() -> None:
    tools = ToolRegistry()
    schema = {
        "type": "object",
        "properties": {"a": {"type": "object", "properties": {"b": {"type": "string"}}}},
    }
    closed = tools.register(lambda **kw: kw, name="closed", effect="read", schema=schema)
    opened = tools.register(
        lambda **kw: kw, name="open", effect="read", schema=schema, allow_extra_fields=True
    )
    payload = {"a": {"b": "x", "c": 1}, "d": 2}
    assert len(list(closed.validator.iter_errors(payload))) == 2
    assert list(opened.validator.iter_errors(payload)) == []
    assert "additionalProperties" not in schema  # the caller's schema is not mutated


def test_a_failing_idempotency_key_function_is_an_invalid_arguments_answer() -> None:
    tools = ToolRegistry()
    tools.register(
        lambda **kw: kw,
        name="w",
        effect="write",
        schema={"type": "object"},
        idempotency_key=lambda a: a["missing"],
    )
    result = Runtime(
        model=ScriptedModel([calls(call("c1", "w")), say("ok")]), tools=tools, allowed_tools={"w"}
    ).run("x")
    assert_valid_run(result)
    assert "idempotency key could not be derived" in result.messages[2]["content"]
    assert result.counters["write_attempts"] == 0


@pytest.mark.parametrize(
    "task, message",
    [
        ([], "non-empty list of message dicts"),
        (["hi"], "non-empty list of message dicts"),
        (42, "must be a string or a non-empty list"),
        (
            [
                {"role": "user", "content": "x"},
                {"role": "tool", "tool_call_id": "c9", "content": "{}"},
            ],
            "orphan tool result for 'c9'",
        ),
        (
            [{"role": "user", "content": "x"}, calls(call("c1", "lookup", order_id="A"))],
            "tool_call_id 'c1' is never answered",
        ),
    ],
)
def test_a_bad_task_history_is_refused_before_the_model_sees_it(task: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        make_runtime([say("hi")]).run(task)


def test_a_valid_history_continues() -> None:
    history = [
        {"role": "user", "content": "x"},
        calls(call("c1", "lookup", order_id="A")),
        {"role": "tool", "tool_call_id": "c1", "content": "{}"},
        say("first answer"),
        {"role": "user", "content": "and now?"},
    ]
    result = make_runtime([say("second answer")]).run(history)
    assert result.answer == "second answer" and result.messages[:5] == history
