"""Models that replay a script: deterministic runs for tests and demos.

:class:`ScriptedModel` returns its steps in order; :class:`KeyedScriptedModel` picks them
by what the history holds, so a run resumed in another process continues where it was."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from fsm_agent._core.streamed import StreamedBlock
from fsm_agent._errors import ConfigError, ModelUnavailableError
from fsm_agent._runtime.context import emit_delta, tracing_deltas

__all__ = ["KeyedScriptedModel", "ScriptedModel", "StreamingScriptedModel", "last_result_id"]

Step = dict[str, Any] | Callable[[list[dict[str, Any]]], Any] | BaseException


class ScriptedModel:
    """Returns its decisions in order.

    Each step is a decision dict, a callable of the history returning one (so a script
    can react to results), or an exception instance to raise. Running past the end
    raises ``IndexError``, which the runtime reports as ``protocol_error/model_error``.
    The position lives in this object: a run resumed in a new process with a new
    ``ScriptedModel`` starts its script again (use :class:`KeyedScriptedModel` there).
    """

    def __init__(self, steps: Sequence[Step]) -> None:
        self.steps = list(steps)
        self.calls = 0
        self.seen: list[list[dict[str, Any]]] = []

    def __call__(self, messages: list[dict[str, Any]], tool_specs: list[dict[str, Any]]) -> Any:
        if self.calls >= len(self.steps):
            raise IndexError(f"ScriptedModel has only {len(self.steps)} steps")
        step = self.steps[self.calls]
        self.calls += 1
        self.seen.append(messages)
        if type(step) is dict:  # a decision, as most steps are: neither raised nor called
            return step
        if isinstance(step, BaseException):
            raise step
        if callable(step):
            return step(messages)
        return step


class StreamingScriptedModel(ScriptedModel):
    """A :class:`ScriptedModel` that streams each decision before returning it, as a
    ``stream=True`` adapter does: its text, reasoning (``reasoning_content``) and each
    call's arguments in pieces of ``chunk`` characters, to the delta sink of
    ``Runtime.stream``. ``cut_after=n`` makes the step fail after its n-th delta, as a
    stream the server cuts does (a ``ModelUnavailableError``: nothing of it is used).
    """

    def __init__(self, steps: Sequence[Step], *, chunk: int = 3, cut_after: int | None = None):
        super().__init__(steps)
        if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1:
            raise ConfigError(
                f"StreamingScriptedModel: chunk must be a whole number >= 1, got {chunk!r}"
            )
        self.chunk = chunk
        self.cut_after = cut_after

    def __call__(self, messages: list[dict[str, Any]], tool_specs: list[dict[str, Any]]) -> Any:
        reply = super().__call__(messages, tool_specs)
        if not isinstance(reply, dict):
            return reply
        sent = 0
        keep = tracing_deltas()
        blocks = []
        for kind, extra, text in _pieces(reply):
            block = StreamedBlock(
                kind.removesuffix("_delta"), extra["index"], call_id=extra.get("call_id"), keep=keep
            )
            for at in range(0, len(text), self.chunk):
                if self.cut_after is not None and sent >= self.cut_after:
                    raise ModelUnavailableError(
                        f"StreamingScriptedModel: the stream was cut after {sent} deltas"
                    )
                piece = text[at : at + self.chunk]
                field = "fragment" if kind == "tool_args_delta" else "text"
                emit_delta(kind, **extra, **{field: piece})
                block.add(piece)
                sent += 1
            if block.deltas:
                blocks.append(block.summary())
        # What a streaming adapter records: the blocks' summaries (a copy: the script
        # may hand out one dict twice).
        return {**reply, "streamed": blocks} if blocks else reply


def _pieces(reply: dict[str, Any]) -> list[tuple[str, dict[str, Any], str]]:
    """The streamed blocks of a decision: (delta type, its block fields, its text)."""
    out: list[tuple[str, dict[str, Any], str]] = []
    if isinstance(reply.get("reasoning_content"), str):
        out.append(("reasoning_delta", {"index": 0}, reply["reasoning_content"]))
    if isinstance(reply.get("content"), str):
        out.append(("text_delta", {"index": 0}, reply["content"]))
    for i, call in enumerate(reply.get("tool_calls") or []):
        fn = call.get("function") if isinstance(call, Mapping) else None
        args = fn.get("arguments") if isinstance(fn, Mapping) else None
        if isinstance(args, str):
            out.append(("tool_args_delta", {"index": i, "call_id": str(call.get("id"))}, args))
    return out


#: A decision of a :class:`KeyedScriptedModel`: a decision dict, a final answer's text,
#: a callable of the history returning a decision, or an exception instance to raise.
KeyedStep = dict[str, Any] | str | Callable[[list[dict[str, Any]]], Any] | BaseException


class KeyedScriptedModel:
    """Picks each decision by what the history already holds, not by how often it was
    asked, so a run resumed in a new process continues where it was.

    ``script`` maps the id of the call whose result is the last one in the history to
    the decision to take then; ``None`` is the decision before any result::

        model = KeyedScriptedModel({
            None: decide(call("lookup", {"order_id": "A17"}, id="c1")),
            "c1": decide(call("issue_refund", {"order_id": "A17"}, id="c2")),
            "c2": "Refunded A17.",       # a string is the final answer
        })

    After a batch of several calls, the key is the id of the batch's last call (results
    are in call order). A :class:`ScriptedModel` counts its steps from zero in each new
    process: resumed after a review, it replays its first decision and asks for the same
    calls again (the runtime then warns that it repeated calls of an earlier round). A
    history with no decision in ``script`` raises ``LookupError``, which the runtime reports as
    ``protocol_error/model_error``; a decision that depends on more than the last result
    (an answer a rule sent back, say) is a callable of the history.
    """

    def __init__(self, script: Mapping[str | None, KeyedStep]) -> None:
        if not isinstance(script, Mapping) or not script:
            raise ConfigError(
                "KeyedScriptedModel takes a non-empty mapping {call id or None: decision}"
            )
        for key, step in script.items():
            if key is not None and (not isinstance(key, str) or not key):
                raise ConfigError(
                    f"KeyedScriptedModel: key {key!r} is not a call id (a non-empty string) "
                    "or None (before any result)"
                )
            if not isinstance(step, (dict, str, BaseException)) and not callable(step):
                raise ConfigError(
                    f"KeyedScriptedModel: the decision after {_name(key)} is {step!r}; give "
                    "a decision dict, an answer string, a callable of the history or an "
                    "exception"
                )
        self.script = dict(script)
        self.calls = 0
        self.seen: list[list[dict[str, Any]]] = []

    def __call__(self, messages: list[dict[str, Any]], tool_specs: list[dict[str, Any]]) -> Any:
        self.calls += 1
        self.seen.append(messages)
        key = last_result_id(messages)
        if key not in self.script:
            known = ", ".join(_name(k) for k in self.script)
            raise LookupError(
                f"KeyedScriptedModel has no decision after {_name(key)} (it has decisions "
                f"after: {known})"
            )
        step = self.script[key]
        if isinstance(step, BaseException):
            raise step
        if isinstance(step, str):
            return {"role": "assistant", "content": step}
        if callable(step):
            return step(messages)
        return step


def last_result_id(messages: list[dict[str, Any]]) -> str | None:
    """The call id of the last tool result in ``messages`` (``None``: no result yet)."""
    for message in reversed(messages):
        if isinstance(message, dict) and message.get("role") == "tool":
            call_id = message.get("tool_call_id")
            return call_id if isinstance(call_id, str) else None
    return None


def _name(key: str | None) -> str:
    return "the start (no result yet)" if key is None else f"a result for {key!r}"
