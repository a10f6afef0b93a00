"""The caller's configuration, checked once: what ``Runtime(...)`` accepts, and what a
run starts from. Everything wrong here is a :class:`~fsm_agent._errors.ConfigError` at
construction (or when the run is asked for), never a surprise mid-run."""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from fsm_agent._core.approvals import Approval
from fsm_agent._core.budget import Budget, RetryPolicy
from fsm_agent._core.engine import check_machine
from fsm_agent._core.history import check_history
from fsm_agent._core.jsonsafe import make_safe
from fsm_agent._core.table import Machine
from fsm_agent._errors import ConfigError
from fsm_agent._rules import Rule, RuleSet, cel
from fsm_agent.tools._registry import ToolRegistry

__all__ = ["check_context", "check_settings", "initial_messages", "rule_set", "tool_facts"]


def check_settings(
    *,
    model: Any,
    tools: Any,
    allowed_tools: Any,
    budget: Any,
    retry: Any,
    approvals: Iterable[Any],
    policy: Any,
    redact: Any,
    machines: Iterable[Any] = (),
) -> None:
    """Raise :class:`ConfigError` for the first setting that cannot work."""
    if not callable(model):
        raise ConfigError(f"model must be callable as (messages, tool_specs), got {model!r}")
    if not isinstance(tools, ToolRegistry):
        raise ConfigError("tools must be a ToolRegistry")
    if isinstance(allowed_tools, str):
        raise ConfigError("allowed_tools must be a collection of tool names, not one string")
    unknown = sorted(frozenset(allowed_tools) - set(tools.names()))
    if unknown:
        raise ConfigError(
            f"allowed_tools names unregistered tools: {', '.join(unknown)} "
            f"(registered: {', '.join(tools.names()) or 'none'})"
        )
    for a in approvals:
        if not isinstance(a, Approval):
            raise ConfigError(f"approvals must be Approval objects, got {a!r}")
        if a.tool not in tools:
            raise ConfigError(f"approval for unregistered tool {a.tool!r}")
    if policy not in ("default", "strict"):
        raise ConfigError(f"policy must be 'default' or 'strict', got {policy!r}")
    if budget is not None and not isinstance(budget, Budget):
        raise ConfigError(f"budget must be a Budget, got {budget!r}")
    if retry is not None and not isinstance(retry, RetryPolicy):
        raise ConfigError(f"retry must be a RetryPolicy, got {retry!r}")
    if redact is not None and not callable(redact):
        raise ConfigError("redact must be a function of one event")
    _check_machines(machines)


def _check_machines(machines: Iterable[Any]) -> None:
    for m in machines:
        if not isinstance(m, Machine):
            raise ConfigError(
                "machine and machines must be Machine values (fsm_agent._core.engine."
                f"compile_machine builds one), got {m!r}"
            )
        check_machine(m)


def initial_messages(task: Any) -> list[dict[str, Any]]:
    """A run's first history: a task string as one user message, or a provider-valid
    history (a JSON-safe copy: the caller's list is never changed)."""
    if isinstance(task, str):
        return [{"role": "user", "content": task}]
    if isinstance(task, list) and task and all(isinstance(m, dict) for m in task):
        messages: list[dict[str, Any]] = make_safe(task)
        problems = check_history(messages)
        if problems:
            raise ConfigError("task messages are not a valid history: " + "; ".join(problems))
        return messages
    raise ConfigError("task must be a string or a non-empty list of message dicts")


def tool_facts(tools: ToolRegistry) -> dict[str, dict[str, Any]]:
    """What each registrar declared, as the trace header records it."""
    return {
        t.name: {
            "effect": t.effect,
            "requires_approval": t.requires_approval,
            "idempotent": t.idempotency_key is not None,
            "dedup": t.dedup,
            "timeout_s": t.timeout_s,
            # The final schema admission validates with: check replays admission with it.
            "schema": t.schema,
        }
        for t in tools
    }


def rule_set(rules: Iterable[Rule], tools: ToolRegistry) -> RuleSet | None:
    """The runtime's rules compiled against its registry (every mistake in one
    :class:`ConfigError`), or None without rules: a run then judges nothing."""
    if isinstance(rules, Rule):
        raise ConfigError("rules must be a list of Rule values, not one Rule (rules=[...])")
    listed = tuple(rules)
    if not listed:
        return None
    return RuleSet(listed, {t.name: t for t in tools})


def check_context(context: Any) -> dict[str, Any]:
    """A run's trusted ``context``, as a copy of plain JSON data (it is stored with the run
    and recorded in its trace header), or :class:`ConfigError` saying what is wrong."""
    if context is None:
        return {}
    if not isinstance(context, dict):
        raise ConfigError(f"context must be a dict of JSON data, got {type(context).__name__}")
    try:
        text = json.dumps(context, allow_nan=False, ensure_ascii=False)
        text.encode("utf-8")
    except (TypeError, ValueError, RecursionError) as exc:
        raise ConfigError(
            f"context must be JSON data (string keys; strings, numbers, booleans, null, "
            f"lists and dicts; no NaN): {type(exc).__name__}: {exc}"
        ) from None
    copied: dict[str, Any] = json.loads(text)
    if make_safe(copied) != copied:
        raise ConfigError("context holds a value a trace cannot record exactly (too deep?)")
    try:  # what CEL can take (the loop hands the context over without screening it again)
        cel.screen(copied, "context")
    except cel.Unrepresentable as exc:
        raise ConfigError(f"context cannot be read by rules: {exc}") from None
    return copied
