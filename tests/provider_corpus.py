"""The recorded real exchanges in tests/data/providers, and what each says.

For every API: how its recorded reply must read (worked out here from the body alone,
independently of the adapter), and how its recorded request maps back to an engine
history, so the adapter can rebuild it and the two can be compared shape for shape.

A request is *expressible* when every part of it has an engine counterpart (text and
media content, function tools, reasoning the adapter keeps); others (built-in server
tools, uploaded-file references, prompt caching marks on turns we merge, ...) are
counted, with the reason, and left out of the rebuild comparison only.
"""

from __future__ import annotations

import base64
import json
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jsonschema import Draft202012Validator

DATA = Path(__file__).parent / "data" / "providers"
APIS = ("openai_chat", "openai_responses", "anthropic_messages")

Json = Any
Message = dict[str, Any]


@dataclass(frozen=True)
class Exchange:
    api: str
    source: str
    host: str
    request: dict[str, Any]
    status: int
    response: dict[str, Any]
    path: str = ""

    @property
    def id(self) -> str:
        return self.source.split("cassettes/", 1)[-1]


def load(api: str) -> list[Exchange]:
    out = []
    for line in (DATA / f"{api}.jsonl").read_text(encoding="utf-8").splitlines():
        e = json.loads(line)
        out.append(Exchange(api, e["source"], e["host"], e["request"], e["status"], e["response"]))
    return out


class OutOfScope(Exception):
    """A recorded request with a part the engine's history has no counterpart for."""


@dataclass(frozen=True)
class Refused:
    """A reply the adapter must refuse with a ModelResponseError whose text has ``needle``."""

    needle: str


# ── tool specs ───────────────────────────────────────────────────────────────────


def chat_specs(tools: Any) -> list[Message]:
    """Chat Completions function specs of a request's tools (any of the three APIs)."""
    specs = []
    for t in tools or ():
        if not isinstance(t, Mapping):
            continue
        if t.get("type") == "function" and isinstance(t.get("function"), Mapping):
            fn = t["function"]
        elif t.get("type") in (None, "function", "custom") and "name" in t:
            fn = {
                "name": t["name"],
                "parameters": t.get("parameters") or t.get("input_schema"),
            }
        else:
            continue
        specs.append({"type": "function", "function": dict(fn)})
    return specs


def _accepts_empty(specs: list[Message], name: Any) -> bool:
    for s in specs:
        if s["function"].get("name") == name:
            schema = s["function"].get("parameters") or {"type": "object"}
            return bool(Draft202012Validator(schema).is_valid({}))
    return False


# ── expected readings ────────────────────────────────────────────────────────────


def chat_reading(body: Json, specs: list[Message]) -> Message | Refused:
    choices = body.get("choices")
    if not isinstance(choices, list) or not choices:
        return Refused("choices")
    choice = choices[0]
    message, finish = choice.get("message") or {}, choice.get("finish_reason")
    if finish not in ("stop", "tool_calls"):
        return Refused("finish_reason")
    if message.get("refusal") and not message.get("content"):
        return Refused("refused")
    calls = []
    for c in message.get("tool_calls") or ():
        fn = c.get("function") or {}
        args = fn.get("arguments")
        if args is None and _accepts_empty(specs, fn.get("name")):
            args = "{}"
        calls.append((c.get("id"), fn.get("name"), args))
    reasoning = {
        k: message[k]
        for k in ("reasoning_content", "reasoning", "reasoning_details")
        if message.get(k) not in (None, "", [])
    }
    return {"content": message.get("content"), "calls": calls, "keep": reasoning}


_ANTHROPIC_CUT = ("max_tokens", "model_context_window_exceeded", "refusal", "pause_turn")


def anthropic_reading(body: Json, specs: list[Message]) -> Message | Refused:
    stop = body.get("stop_reason")
    if stop in _ANTHROPIC_CUT or stop not in ("end_turn", "tool_use", "stop_sequence"):
        return Refused("stop_reason")
    texts, calls, thinking = [], [], False
    for block in body.get("content") or ():
        kind = block.get("type")
        if kind == "text":
            texts.append(block["text"])
        elif kind == "tool_use":
            calls.append(
                (block["id"], block["name"], json.dumps(block["input"], ensure_ascii=False))
            )
        elif kind in ("thinking", "redacted_thinking"):
            thinking = True
        else:
            return Refused("unknown type")
    content = "".join(texts) if texts else (None if calls else "")
    keep = {"anthropic_content": body["content"]} if thinking else {}
    return {"content": content, "calls": calls, "keep": keep}


def responses_reading(body: Json, specs: list[Message]) -> Message | Refused:
    if body.get("status") != "completed":
        return Refused("status")
    texts, calls, reasoning = [], [], False
    for item in body.get("output") or ():
        kind = item.get("type")
        if kind == "message":
            for part in item.get("content") or ():
                if part.get("type") == "refusal":
                    return Refused("refused")
                if part.get("type") != "output_text":
                    return Refused("unknown type")
                texts.append(part["text"])
        elif kind == "function_call":
            calls.append((item.get("call_id"), item.get("name"), item.get("arguments")))
        elif kind == "reasoning":
            reasoning = True
        else:
            return Refused("unknown type")
    content = "".join(texts) if texts else (None if calls else "")
    keep = {"responses_output": body["output"]} if reasoning else {}
    return {"content": content, "calls": calls, "keep": keep}


READINGS: dict[str, Callable[[Json, list[Message]], Message | Refused]] = {
    "openai_chat": chat_reading,
    "anthropic_messages": anthropic_reading,
    "openai_responses": responses_reading,
}


# ── recorded requests back to an engine history ──────────────────────────────────

_CHAT_KEYS = ("role", "content", "name", "tool_calls", "tool_call_id")


def chat_history(request: Json) -> tuple[list[Message], list[Message], Message]:
    messages = []
    for m in request["messages"]:
        extra = set(m) - set(_CHAT_KEYS) - {"reasoning_content", "reasoning", "reasoning_details"}
        if extra - {"prefix"} or m.get("prefix"):
            raise OutOfScope(f"message keys {sorted(extra)}")
        if m["role"] == "assistant" and not isinstance(m.get("content"), (str, type(None))):
            raise OutOfScope("assistant content as parts (the engine keeps text)")
        if m["role"] == "assistant":
            messages.append({"assistant_reply": m})
        else:
            messages.append({k: m[k] for k in _CHAT_KEYS if k in m})
    options = {k: v for k, v in request.items() if k not in ("messages", "tools", "model")}
    return messages, chat_specs(request.get("tools")), options


def _data_url(media_type: str, data: str) -> str:
    return f"data:{media_type};base64,{data}"


def _anthropic_part(block: Mapping[str, Any]) -> Message:
    """An Anthropic content block as a Chat Completions content part."""
    kind, source = block.get("type"), block.get("source") or {}
    if kind == "text":
        return {"type": "text", "text": block["text"]}
    if kind == "image" and source.get("type") == "base64":
        return {
            "type": "image_url",
            "image_url": {"url": _data_url(source["media_type"], source["data"])},
        }
    if kind == "document" and source.get("type") == "base64":
        return {
            "type": "file",
            "file": {"file_data": _data_url(source["media_type"], source["data"])},
        }
    if kind == "document" and source.get("type") == "text":
        data = base64.b64encode(source["data"].encode()).decode()
        return {"type": "file", "file": {"file_data": _data_url(source["media_type"], data)}}
    raise OutOfScope(f"{kind} block with a {source.get('type')} source")


def _anthropic_user(blocks: list[Any], messages: list[Message]) -> None:
    rest = []
    for b in blocks:
        if b.get("type") == "tool_result":
            content = b.get("content")
            if isinstance(content, list):
                parts = [_anthropic_part(p) for p in content]
                content = (
                    parts
                    if any(p["type"] != "text" for p in parts)
                    else ("".join(p["text"] for p in parts))
                )
            messages.append({"role": "tool", "tool_call_id": b["tool_use_id"], "content": content})
        else:
            rest.append(_anthropic_part(b))
    if rest:
        only_text = all(p["type"] == "text" for p in rest)
        said: Any = "".join(p["text"] for p in rest) if only_text else rest
        messages.append({"role": "user", "content": said})


_ANTHROPIC_ASSISTANT = ("text", "tool_use", "thinking", "redacted_thinking")


def anthropic_history(request: Json) -> tuple[list[Message], list[Message], Message]:
    messages: list[Message] = []
    system = request.get("system")
    if isinstance(system, list):
        system = "\n\n".join(b["text"] for b in system)
    if system:
        messages.append({"role": "system", "content": system})
    for m in request["messages"]:
        blocks = m["content"]
        if isinstance(blocks, str):
            blocks = [{"type": "text", "text": blocks}]
        if m["role"] == "system":
            raise OutOfScope("a system message inside messages")
        if m["role"] == "assistant":
            kinds = {b.get("type") for b in blocks}
            if kinds - set(_ANTHROPIC_ASSISTANT):
                raise OutOfScope(f"assistant blocks {sorted(kinds - set(_ANTHROPIC_ASSISTANT))}")
            messages.append({"assistant_reply": {"content": blocks}})
        else:
            _anthropic_user(blocks, messages)
    options = {
        k: v for k, v in request.items() if k not in ("messages", "tools", "model", "system")
    }
    return messages, chat_specs(request.get("tools")), options


def _responses_part(part: Mapping[str, Any]) -> Message:
    kind = part.get("type")
    if kind == "input_text":
        return {"type": "text", "text": part["text"]}
    if kind == "input_image" and str(part.get("image_url", "")).startswith("data:"):
        return {"type": "image_url", "image_url": {"url": part["image_url"]}}
    if kind == "input_file" and part.get("file_data"):
        file = {"file_data": part["file_data"]}
        if part.get("filename"):
            file["filename"] = part["filename"]
        return {"type": "file", "file": file}
    raise OutOfScope(f"a {kind} output part by reference")


_ASSISTANT_ITEMS = ("reasoning", "function_call")


def _is_assistant_item(item: Mapping[str, Any]) -> bool:
    kind = item.get("type", "message")
    return kind in _ASSISTANT_ITEMS or (kind == "message" and item.get("role") == "assistant")


def responses_history(request: Json) -> tuple[list[Message], list[Message], Message]:
    if request.get("previous_response_id") or request.get("conversation"):
        raise OutOfScope("a continuation of a stored response")
    items = request["input"]
    if isinstance(items, str):
        items = [{"role": "user", "content": items}]
    messages: list[Message] = []
    group: list[Any] = []
    for item in [*items, None]:
        if item is not None and _is_assistant_item(item):
            group.append(item)
            continue
        if group:
            messages.append({"assistant_reply": {"output": group}})
            group = []
        if item is None:
            break
        kind = item.get("type", "message")
        if kind == "function_call_output":
            output = item["output"]
            if isinstance(output, list):
                output = [_responses_part(p) for p in output]
            messages.append({"role": "tool", "tool_call_id": item["call_id"], "content": output})
        elif kind == "message":
            if set(item) - {"role", "content", "type"}:
                raise OutOfScope(f"message item keys {sorted(set(item) - {'role', 'content'})}")
            messages.append({"role": item["role"], "content": item["content"]})
        else:
            raise OutOfScope(f"a {kind} item")
    options = {k: v for k, v in request.items() if k not in ("input", "tools", "model")}
    return messages, chat_specs(request.get("tools")), options


HISTORIES = {
    "openai_chat": chat_history,
    "anthropic_messages": anthropic_history,
    "openai_responses": responses_history,
}


# ── assistant turns as reply bodies, for the adapter's own reader ─────────────────


def reply_body(api: str, turn: Message) -> Json:
    """A reply body saying what a recorded assistant turn says, for ``read_reply``."""
    if api == "openai_chat":
        message = turn
        finish = "tool_calls" if message.get("tool_calls") else "stop"
        return {"choices": [{"index": 0, "message": message, "finish_reason": finish}]}
    if api == "anthropic_messages":
        blocks = turn["content"]
        stop = "tool_use" if any(b.get("type") == "tool_use" for b in blocks) else "end_turn"
        return {"type": "message", "role": "assistant", "content": blocks, "stop_reason": stop}
    output = []
    for item in turn["output"]:
        if item.get("type", "message") == "message" and "type" not in item:
            content = item["content"]
            if isinstance(content, str):
                content = [{"type": "output_text", "text": content}]
            item = {"type": "message", "role": "assistant", "content": content}
        output.append(item)
    return {"status": "completed", "output": output}


# ── shapes to compare ────────────────────────────────────────────────────────────


def _drop(value: Any, keys: tuple[str, ...]) -> Any:
    if isinstance(value, Mapping):
        return {k: _drop(v, keys) for k, v in value.items() if k not in keys}
    if isinstance(value, list):
        return [_drop(v, keys) for v in value]
    return value


def _chat_content(content: Any) -> Any:
    """Text parts as the one string they say (the adapter sends tool text so)."""
    content = _drop(content, ("cache_control",))
    if isinstance(content, list) and all(p.get("type") == "text" for p in content):
        return "".join(p["text"] for p in content)
    return content


def chat_shape(request: Json, send_reasoning: tuple[str, ...]) -> list[Any]:
    shape = []
    for m in request["messages"]:
        entry: dict[str, Any] = {"role": m["role"], "content": _chat_content(m.get("content"))}
        if m.get("tool_calls"):
            entry["calls"] = [
                (c.get("id"), c["function"]["name"], c["function"].get("arguments") or "{}")
                for c in m["tool_calls"]
            ]
        if "tool_call_id" in m:
            entry["answers"] = m["tool_call_id"]
        entry.update((k, m[k]) for k in send_reasoning if m.get(k) is not None)
        shape.append(entry)
    return shape


def _text_run(blocks: list[Any]) -> list[Any]:
    """Adjacent text blocks as one (the engine keeps an assistant's text as one string)."""
    out: list[Any] = []
    for b in blocks:
        if b.get("type") == "text" and out and out[-1].get("type") == "text":
            out[-1] = {"type": "text", "text": out[-1]["text"] + b["text"]}
        else:
            out.append(b)
    return out


def _anthropic_block(b: Mapping[str, Any]) -> Any:
    b = _drop(b, ("cache_control", "citations", "is_error"))
    if b.get("type") == "tool_result":
        content = b.get("content")
        if isinstance(content, str):
            content = [{"type": "text", "text": content}]
        b = {**b, "content": _text_run(content or [])}
    return b


def anthropic_shape(request: Json) -> Message:
    turns: list[Message] = []
    for m in request["messages"]:
        blocks = m["content"]
        if isinstance(blocks, str):
            blocks = [{"type": "text", "text": blocks}]
        if turns and turns[-1]["role"] == m["role"]:
            turns[-1]["content"].extend(blocks)
        else:
            turns.append({"role": m["role"], "content": list(blocks)})
    for t in turns:
        t["content"] = _text_run([_anthropic_block(b) for b in t["content"]])
    system = request.get("system")
    if isinstance(system, list):
        system = "\n\n".join(b["text"] for b in system)
    return {"system": system or None, "turns": turns}


def _responses_item(item: Mapping[str, Any]) -> Any:
    kind = item.get("type", "message")
    if kind == "message":
        content = item.get("content")
        if isinstance(content, list):
            texts = [
                p.get("text") for p in content if p.get("type") in ("output_text", "input_text")
            ]
            others = [p for p in content if p.get("type") not in ("output_text", "input_text")]
            content = ("".join(texts), others) if others else "".join(texts)
        return ("message", item.get("role"), content)
    if kind == "function_call":
        return ("function_call", item.get("call_id"), item.get("name"), item.get("arguments"))
    if kind == "function_call_output":
        return ("function_call_output", item.get("call_id"), item.get("output"))
    return dict(item)


def responses_shape(request: Json) -> list[Any]:
    items = request["input"]
    if isinstance(items, str):
        items = [{"role": "user", "content": items}]
    shape: list[Any] = []
    for item in map(_responses_item, items):
        if item == ("message", "assistant", ""):
            continue  # an empty assistant text says nothing; the engine sends none
        last = shape[-1] if shape else None
        if (
            isinstance(item, tuple)
            and item[:2] == ("message", "assistant")
            and isinstance(last, tuple)
            and last[:2] == ("message", "assistant")
        ):
            shape[-1] = (
                "message",
                "assistant",
                last[2] + item[2],
            )  # one text, as the engine keeps it
        else:
            shape.append(item)
    return shape


def _reasoning(e: Exchange) -> bool:
    body = e.response
    if e.api == "openai_chat":
        return any(
            c["message"].get(k) not in (None, "", [])
            for c in body.get("choices") or []
            for k in ("reasoning_content", "reasoning", "reasoning_details")
        )
    if e.api == "anthropic_messages":
        return any(
            b.get("type") in ("thinking", "redacted_thinking") for b in body.get("content") or []
        )
    return any(i.get("type") == "reasoning" for i in body.get("output") or [])


def _calls(e: Exchange) -> int:
    body = e.response
    if e.api == "openai_chat":
        return max(
            (len(c["message"].get("tool_calls") or []) for c in body.get("choices") or []),
            default=0,
        )
    if e.api == "anthropic_messages":
        return sum(b.get("type") == "tool_use" for b in body.get("content") or [])
    return sum(i.get("type") == "function_call" for i in body.get("output") or [])


def _media_results(e: Exchange) -> bool:
    """Whether the request answers a tool call with an image or a file (Chat Completions:
    in the user message right after the tool messages, which is where it can go)."""
    r = e.request
    if e.api == "anthropic_messages":
        return any(
            isinstance(b.get("content"), list)
            and any(p.get("type") in ("image", "document") for p in b["content"])
            for m in r["messages"]
            if isinstance(m["content"], list)
            for b in m["content"]
            if b.get("type") == "tool_result"
        )
    if e.api == "openai_responses":
        return any(
            isinstance(i.get("output"), list)
            and any(p.get("type") in ("input_image", "input_file") for p in i["output"])
            for i in r["input"]
            if isinstance(r["input"], list)
            if i.get("type") == "function_call_output"
        )
    messages = r["messages"]
    return any(
        m["role"] == "user"
        and i > 0
        and messages[i - 1]["role"] == "tool"
        and isinstance(m.get("content"), list)
        and any(p.get("type") in ("image_url", "file") for p in m["content"])
        for i, m in enumerate(messages)
    )


_MEDIA = {
    "openai_chat": ('"image_url"', '"file_data"'),
    "anthropic_messages": ('"type": "image"', '"type": "document"'),
    "openai_responses": ('"input_image"', '"input_file"'),
}


def coverage(exchanges: list[Exchange]) -> Counter[str]:
    """What the corpus holds: parallel calls, reasoning, media in requests, errors."""
    seen: Counter[str] = Counter()
    for e in exchanges:
        request = json.dumps(e.request)
        seen["error replies"] += e.status != 200
        seen["parallel calls"] += _calls(e) > 1
        seen["reasoning replies"] += _reasoning(e)
        seen["media in requests"] += any(m in request for m in _MEDIA[e.api])
        seen["media tool results"] += _media_results(e)
    return seen
