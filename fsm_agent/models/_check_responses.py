"""What the OpenAI Responses API refuses in an ``input`` item list (private: use
:mod:`fsm_agent.models._validate`).

Known rules, each seen in a real 400:

* every ``function_call`` is answered by a ``function_call_output`` with its ``call_id``
  ("No tool output found for function call"), and an output answers a call before it
  ("No tool call found for function call output"; a client-executed call of another
  type, such as ``tool_search_call``, counts) — unless the request continues a stored
  response (``previous_response_id`` or ``conversation``), whose calls are not in
  ``input``;
* a ``reasoning`` item is followed by the item it produced, sent with that item's ``id``
  ("... of type 'reasoning' was provided without its required following item") — an
  OpenAI rule only: compatible servers (DeepSeek's ``/responses``) accept a reasoning item
  followed by items without ids, so ``reasoning_followers=False`` leaves it out;
* with ``store: false`` a reasoning item must carry its ``encrypted_content`` (the
  server keeps nothing to look the id up in: "Items are not persisted when ``store`` is
  set to false");
* an item ``id`` appears once ("Duplicate item found with id").

Every other item type (built-in tool calls, MCP items, compaction, ...) and every
content part type is accepted as it is.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["check_openai_responses", "check_openai_responses_request"]

_UNANSWERED = "No tool output found for function call"
_ORPHAN = "No tool call found for function call output"
_REASONING_ALONE = "was provided without its required following item"
_NOT_STORED = "Items are not persisted when `store` is set to false"
_ROLES = ("system", "developer", "user", "assistant")
_OUTPUT_PARTS = ("input_text", "input_image", "input_file")


def _check_output(i: int, output: Any) -> list[str]:
    if isinstance(output, str):
        return []
    if isinstance(output, list) and all(
        isinstance(p, Mapping) and p.get("type") in _OUTPUT_PARTS for p in output
    ):
        return []
    return [
        f"item {i}: a function_call_output's output must be a string or a list of "
        f"{'/'.join(_OUTPUT_PARTS)} parts"
    ]


class _Pairing:
    """function_call / function_call_output bookkeeping over one input list."""

    def __init__(self, continuing: bool) -> None:
        self.continuing = continuing
        self.calls: dict[str, int] = {}
        self.other_calls: set[str] = set()  # call_ids of built-in/client tool calls
        self.answered: set[str] = set()
        self.problems: list[str] = []

    def call(self, i: int, item: Mapping[str, Any]) -> None:
        call_id = item.get("call_id")
        if not isinstance(call_id, str) or not call_id:
            self.problems.append(f"item {i}: a function_call without a call_id")
        elif call_id in self.calls:
            self.problems.append(f"item {i}: call_id {call_id!r} is used twice")
        else:
            self.calls[call_id] = i
        if not isinstance(item.get("arguments"), str) or not item.get("name"):
            self.problems.append(f"item {i}: a function_call needs a name and string arguments")

    def output(self, i: int, item: Mapping[str, Any]) -> None:
        call_id = item.get("call_id")
        if call_id in self.answered:
            self.problems.append(f"item {i}: call_id {call_id!r} is answered twice")
        elif call_id in self.calls:
            self.answered.add(call_id)
        elif call_id not in self.other_calls and not self.continuing:
            self.problems.append(
                f"item {i}: output for call_id {call_id!r} has no function_call "
                f"before it (OpenAI: {_ORPHAN} {call_id})"
            )
        self.problems.extend(_check_output(i, item.get("output")))

    def unanswered(self) -> list[str]:
        return [
            f"item {at}: function_call {call_id!r} is never answered "
            f"(OpenAI: {_UNANSWERED} {call_id})"
            for call_id, at in self.calls.items()
            if call_id not in self.answered
        ]


def _check_reasoning(i: int, items: list[Any], store: bool, followers: bool) -> list[str]:
    item = items[i]
    problems = []
    if not store and not item.get("encrypted_content"):
        problems.append(
            f"item {i}: reasoning item {item.get('id')!r} has no encrypted_content, and with "
            f"store false the server cannot look it up (OpenAI: {_NOT_STORED})"
        )
    if not followers:
        return problems
    follower = next(
        (
            x
            for x in items[i + 1 :]
            if not (isinstance(x, Mapping) and x.get("type") == "reasoning")
        ),
        None,
    )
    if not isinstance(follower, Mapping) or not follower.get("id"):
        problems.append(
            f"item {i}: reasoning item {item.get('id')!r} must be followed by the item it "
            f"produced, with that item's id (OpenAI: {_REASONING_ALONE})"
        )
    return problems


def _check_message(i: int, item: Mapping[str, Any]) -> list[str]:
    problems = []
    if item.get("role") not in _ROLES:
        problems.append(f"item {i}: message role {item.get('role')!r} is not accepted")
    if not isinstance(item.get("content"), (str, list)):
        problems.append(f"item {i}: a message item needs content")
    return problems


def check_openai_responses(
    items: list[dict[str, Any]],
    *,
    store: bool = True,
    continuing: bool = False,
    reasoning_followers: bool = True,
) -> list[str]:
    """What the OpenAI Responses API would reject in an ``input`` item list.

    ``store`` is the request's ``store`` (the API's default is true); ``continuing`` is
    true when the request names a ``previous_response_id`` or a ``conversation``;
    ``reasoning_followers=False`` drops OpenAI's rule that a reasoning item is followed
    by an item with an id (for compatible servers, which do not have it).
    """
    pairing = _Pairing(continuing)
    problems = pairing.problems
    ids: set[str] = set()
    for i, item in enumerate(items):
        if not isinstance(item, Mapping):
            problems.append(f"item {i}: an input item must be an object")
            continue
        item_id = item.get("id")
        if isinstance(item_id, str) and item_id:
            if item_id in ids:
                problems.append(f"item {i}: duplicate item id {item_id!r}")
            ids.add(item_id)
        kind = item.get("type", "message")
        if kind == "function_call":
            pairing.call(i, item)
        elif kind == "function_call_output":
            pairing.output(i, item)
        elif kind == "reasoning":
            problems.extend(_check_reasoning(i, items, store, reasoning_followers))
        elif kind == "message":
            problems.extend(_check_message(i, item))
        elif isinstance(item.get("call_id"), str) and not str(kind).endswith("_output"):
            # e.g. a client-executed tool_search_call, which a function_call_output answers
            pairing.other_calls.add(item["call_id"])
    return problems + pairing.unanswered()


def check_openai_responses_request(
    body: Mapping[str, Any], *, reasoning_followers: bool = True
) -> list[str]:
    """:func:`check_openai_responses` on a whole request body (``input`` may be a string)."""
    items = body.get("input")
    if isinstance(items, str):
        return []
    if not isinstance(items, list):
        return ["the request has no input list"]
    continuing = bool(body.get("previous_response_id") or body.get("conversation"))
    return check_openai_responses(
        items,
        store=body.get("store") is not False,
        continuing=continuing,
        reasoning_followers=reasoning_followers,
    )
