"""What a trace keeps of a streamed reply, and the check that it folds to the message.

A streaming adapter (``models/_stream.py``, ``StreamingScriptedModel``) records, in the
decision's ``message.streamed``, one summary per content block: its ``kind`` (``text``,
``reasoning``, ``tool_args``), ``index``, ``chars`` (the length of the block's text),
``deltas`` (how many pieces it arrived in) and ``sha256``, a digest of the piece
sequence (length-prefixed, so it names the split, not only the joined text); a
``tool_args`` block also names its ``call_id``. That is the coalesced form, the default.
With raw deltas on (``Runtime.stream(..., trace_deltas=True)``) the summary also keeps
``pieces``, the deltas themselves, in order.

:func:`fold_problems` is what ``fsm-agent check`` asks of every streamed decision: the
summaries are well-formed, the pieces (when kept) are the ones the count and digest
name, and the blocks fold to the recorded message — text blocks joined in index order
are its ``content``, reasoning blocks its reasoning (where the API keeps it as text),
each ``tool_args`` block is the arguments of the call it names. A
delta edited after the fact, or a message edited without its deltas, is a violation.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from typing import Any

__all__ = ["KINDS", "StreamedBlock", "digest_of", "fold_problems"]

KINDS = ("text", "reasoning", "tool_args")


class StreamedBlock:
    """One block of a reply being streamed: counts and digests its deltas as they come."""

    __slots__ = ("call_id", "chars", "deltas", "digest", "index", "kind", "pieces")

    def __init__(
        self, kind: str, index: int, *, call_id: str | None = None, keep: bool = False
    ) -> None:
        self.kind, self.index, self.call_id = kind, index, call_id
        self.chars = 0
        self.deltas = 0
        self.digest = hashlib.sha256()
        self.pieces: list[str] | None = [] if keep else None

    def add(self, text: str) -> None:
        self.chars += len(text)
        self.deltas += 1
        _feed(self.digest, text)
        if self.pieces is not None:
            self.pieces.append(text)

    def summary(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "kind": self.kind,
            "index": self.index,
            "chars": self.chars,
            "deltas": self.deltas,
            "sha256": self.digest.hexdigest(),
        }
        if self.call_id is not None:
            out["call_id"] = self.call_id
        if self.pieces is not None:
            out["pieces"] = list(self.pieces)
        return out


def _feed(digest: Any, text: str) -> None:
    data = text.encode("utf-8", "surrogatepass")
    digest.update(len(data).to_bytes(8, "big") + data)


def digest_of(pieces: Iterable[str]) -> str:
    """The ``sha256`` a block of these deltas records."""
    digest = hashlib.sha256()
    for piece in pieces:
        _feed(digest, piece)
    return digest.hexdigest()


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _block_problems(i: int, block: Any) -> list[str]:
    where = f"streamed[{i}]"
    if not isinstance(block, dict):
        return [f"{where} is not an object"]
    problems = []
    if block.get("kind") not in KINDS:
        problems.append(f"{where}.kind is {block.get('kind')!r}, not one of {', '.join(KINDS)}")
    for name in ("index", "chars", "deltas"):
        if not _whole(block.get(name)):
            problems.append(f"{where}.{name} is not a whole number")
    sha = block.get("sha256")
    if not (isinstance(sha, str) and len(sha) == 64):
        problems.append(f"{where}.sha256 is not a SHA-256 hex digest")
    pieces = block.get("pieces")
    if pieces is None or problems:
        return problems
    if not isinstance(pieces, list) or not all(isinstance(p, str) for p in pieces):
        return [f"{where}.pieces is not a list of strings"]
    if len(pieces) != block["deltas"]:
        problems.append(f"{where} records {block['deltas']} deltas but keeps {len(pieces)}")
    if sum(len(p) for p in pieces) != block["chars"]:
        problems.append(f"{where}'s deltas are not {block['chars']} characters long")
    if digest_of(pieces) != sha:
        problems.append(f"{where}'s deltas are not the ones its sha256 names (a delta changed)")
    return problems


def _text(block: dict[str, Any]) -> str | None:
    pieces = block.get("pieces")
    return "".join(pieces) if isinstance(pieces, list) else None


def _same_arguments(streamed: str, recorded: Any) -> bool:
    """The streamed arguments are the call's, as text or (re-serialised by the adapter,
    as Anthropic's ``input`` is) as the same JSON value."""
    if streamed == recorded:
        return True
    try:
        return bool(json.loads(streamed or "{}") == json.loads(recorded))
    except (TypeError, ValueError):
        return False


def _text_problems(blocks: list[dict[str, Any]], message: dict[str, Any]) -> list[str]:
    texts = sorted((b for b in blocks if b["kind"] == "text"), key=lambda b: b["index"])
    if not texts:
        return []
    content = message.get("content")
    content = content if isinstance(content, str) else ""
    chars = sum(b["chars"] for b in texts)
    if chars != len(content):
        return [f"the text deltas are {chars} characters; the message's content {len(content)}"]
    joined = [_text(b) for b in texts]
    if all(t is not None for t in joined) and "".join(t or "" for t in joined) != content:
        return ["the text deltas do not join to the message's content"]
    return []


def _reasoning_text(message: dict[str, Any]) -> str | None:
    """The reasoning a message keeps, joined, where this API keeps it as text (Chat's
    ``reasoning_content``/``reasoning``, Anthropic's thinking blocks, the Responses
    reasoning items' summaries and text); ``None`` where it keeps none to compare."""
    for key in ("reasoning_content", "reasoning"):
        if isinstance(message.get(key), str):
            return str(message[key])
    blocks = message.get("anthropic_content")
    if isinstance(blocks, list):
        return "".join(
            str(b.get("thinking", "")) for b in blocks
            if isinstance(b, dict) and b.get("type") == "thinking"
        )  # fmt: skip
    items = message.get("responses_output")
    if isinstance(items, list):
        parts = [
            str(part.get("text", ""))
            for item in items
            if isinstance(item, dict) and item.get("type") == "reasoning"
            for key in ("summary", "content")
            for part in item.get(key) or []
            if isinstance(part, dict)
        ]
        return "".join(parts)
    return None


def _reasoning_problems(blocks: list[dict[str, Any]], message: dict[str, Any]) -> list[str]:
    thoughts = sorted((b for b in blocks if b["kind"] == "reasoning"), key=lambda b: b["index"])
    recorded = _reasoning_text(message) if thoughts else None
    if recorded is None:
        return []
    chars = sum(b["chars"] for b in thoughts)
    if chars != len(recorded):
        return [f"the reasoning deltas are {chars} characters; the message's {len(recorded)}"]
    joined = [_text(b) for b in thoughts]
    if all(t is not None for t in joined) and "".join(t or "" for t in joined) != recorded:
        return ["the reasoning deltas do not join to the message's reasoning"]
    return []


def _args_problems(blocks: list[dict[str, Any]], message: dict[str, Any]) -> list[str]:
    calls: dict[Any, list[Any]] = {}  # id -> the arguments of each call with it (ids may repeat)
    for call in message.get("tool_calls") or []:
        fn = call.get("function") if isinstance(call, dict) else None
        if isinstance(fn, dict):
            calls.setdefault(call.get("id"), []).append(fn.get("arguments"))
    problems = []
    for block in blocks:
        if block["kind"] != "tool_args" or "call_id" not in block:
            continue  # a trace from before blocks named their call
        call_id = block["call_id"]
        if call_id not in calls:
            problems.append(f"argument deltas of call {call_id!r}, which the message lacks")
            continue
        text = _text(block)
        if text is not None and not any(_same_arguments(text, a) for a in calls[call_id]):
            problems.append(f"the argument deltas of {call_id!r} do not fold to its arguments")
    return problems


def fold_problems(message: Any) -> list[str]:
    """What is wrong with a decision's ``streamed`` record ([] if nothing, or if the
    reply was not streamed)."""
    if not isinstance(message, dict) or "streamed" not in message:
        return []
    streamed = message["streamed"]
    if not isinstance(streamed, list):
        return ["streamed is not a list of blocks"]
    problems = [p for i, b in enumerate(streamed) for p in _block_problems(i, b)]
    if problems:
        return problems
    return (
        _text_problems(streamed, message)
        + _reasoning_problems(streamed, message)
        + _args_problems(streamed, message)
    )
