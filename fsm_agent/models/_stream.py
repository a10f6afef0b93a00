"""Streamed replies: the SSE bytes of each API folded back into its unstreamed body.

A streaming adapter reads the raw bytes of an HTTP-200 event stream, feeds each event
to the fold of its API, and hands the folded body to the same ``read_reply`` an
unstreamed call uses: the streamed and the unstreamed reply of one exchange are built by
one reader, so they cannot disagree. While folding, each piece of text, reasoning or
tool-call arguments goes to the delta sink of the current context (``Runtime.stream``
sets one); the sink only observes, the loop decides on the folded body.

A stream that ends before its API's terminal event (a cut connection), or that carries
an error event, raises: the model call failed, and nothing of the partial message is
returned. A stream with no usage event folds to a body without ``usage``: the reader
then records usage as unknown, never as zero.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from fsm_agent._core.streamed import StreamedBlock
from fsm_agent._errors import ModelResponseError, ModelUnavailableError
from fsm_agent._runtime.context import emit_delta, tracing_deltas

__all__ = [
    "AnthropicFold",
    "ChatFold",
    "Fold",
    "ResponsesFold",
    "SseParser",
    "fold_bytes",
]

Message = dict[str, Any]


class SseParser:
    """Server-sent events from byte chunks split anywhere (inside a line or a UTF-8
    sequence too): lines are cut on bytes and decoded whole."""

    def __init__(self) -> None:
        self._buffer = b""
        self._event: str | None = None
        self._data: list[str] = []

    def feed(self, chunk: bytes) -> Iterator[tuple[str | None, str]]:
        self._buffer += chunk
        while True:
            cut = _line_end(self._buffer)
            if cut is None:
                return
            end, after = cut
            line = self._buffer[:end].decode("utf-8", errors="replace")
            self._buffer = self._buffer[after:]
            found = self._line(line)
            if found is not None:
                yield found

    def close(self) -> Iterator[tuple[str | None, str]]:
        """The last event, if the stream ended without its blank line."""
        if self._buffer:
            found = self._line(self._buffer.decode("utf-8", errors="replace"))
            self._buffer = b""
            if found is not None:
                yield found
        found = self._line("")
        if found is not None:
            yield found

    def _line(self, line: str) -> tuple[str | None, str] | None:
        if not line:
            if not self._data and self._event is None:
                return None
            event = (self._event, "\n".join(self._data))
            self._event, self._data = None, []
            return event
        if line.startswith(":"):
            return None
        name, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if name == "event":
            self._event = value
        elif name == "data":
            self._data.append(value)
        return None


def _line_end(buffer: bytes) -> tuple[int, int] | None:
    """Where the first line of ``buffer`` ends and the next begins (LF, CRLF or CR)."""
    lf, cr = buffer.find(b"\n"), buffer.find(b"\r")
    if cr == -1 and lf == -1:
        return None
    if cr == -1 or (lf != -1 and lf < cr):
        return lf, lf + 1
    if cr + 1 == len(buffer):  # a CR last: its LF may be in the next chunk
        return None
    return cr, cr + (2 if buffer[cr + 1 : cr + 2] == b"\n" else 1)


class Fold:
    """The fold of one API's stream into its unstreamed body."""

    provider: str = ""

    def __init__(self) -> None:
        self.done = False
        self._blocks: dict[tuple[str, int], StreamedBlock] = {}
        self._keep = tracing_deltas()

    def feed(self, event: str | None, data: str) -> None:
        raise NotImplementedError

    def body(self) -> Message:
        raise NotImplementedError

    def blocks(self) -> list[Message]:
        return [b.summary() for b in self._blocks.values()]

    def _json(self, data: str) -> Any:
        try:
            return json.loads(data)
        except ValueError:
            raise ModelResponseError(
                f"{self.provider}: a stream event is not JSON: {data[:200]!r}"
            ) from None

    def _delta(self, kind: str, index: int, text: Any, call_id: str | None = None) -> None:
        if not isinstance(text, str) or not text:
            return
        block = self._blocks.get((kind, index))
        if block is None:
            named = (call_id or "") if kind == "tool_args" else None
            block = StreamedBlock(kind, index, call_id=named, keep=self._keep)
            self._blocks[(kind, index)] = block
        block.add(text)
        if kind == "tool_args":
            emit_delta("tool_args_delta", index=index, fragment=text, call_id=call_id or "")
        else:
            emit_delta(f"{kind}_delta", index=index, text=text)

    def _cut(self) -> ModelUnavailableError:
        return ModelUnavailableError(
            f"{self.provider}: the stream ended before its last event (a cut connection); "
            "nothing of the partial message is used"
        )


def _stream_error(provider: str, error: Any) -> Exception:
    """The error an error event inside a 200 stream stands for (overload: retryable)."""
    detail = error.get("message") if isinstance(error, Mapping) else None
    kind = error.get("type") if isinstance(error, Mapping) else None
    text = f"{provider}: the stream carried an error event ({kind}): {detail or error!r}"[:600]
    if kind in ("overloaded_error", "api_error", "rate_limit_error", "server_error"):
        return ModelUnavailableError(text)
    return ModelResponseError(text)


class ChatFold(Fold):
    """Chat Completions chunks (``data: {...}`` ... ``data: [DONE]``)."""

    provider = "openai-chat"

    def __init__(self) -> None:
        super().__init__()
        self.head: Message = {}
        self.text: list[str] = []
        self.refusal: list[str] = []
        self.reasoning: dict[str, list[str]] = {}
        self.extra: Message = {}
        self.calls: dict[int, Message] = {}
        self.finish: Any = None
        self.usage: Any = None

    def feed(self, event: str | None, data: str) -> None:
        if data.strip() == "[DONE]":
            self.done = True
            return
        chunk = self._json(data)
        if not isinstance(chunk, Mapping):
            raise ModelResponseError(f"{self.provider}: a stream chunk is not an object")
        if "error" in chunk:
            raise _stream_error(self.provider, chunk["error"])
        for key in ("id", "model", "created", "object", "system_fingerprint"):
            if key in chunk and key not in self.head:
                self.head[key] = chunk[key]
        if isinstance(chunk.get("usage"), Mapping):
            self.usage = chunk["usage"]
        for choice in chunk.get("choices") or []:
            if isinstance(choice, Mapping) and choice.get("index", 0) == 0:
                self._choice(choice)

    def _choice(self, choice: Mapping[str, Any]) -> None:
        if choice.get("finish_reason") is not None:
            self.finish = choice["finish_reason"]
        delta = choice.get("delta")
        if not isinstance(delta, Mapping):
            return
        if isinstance(delta.get("content"), str):
            self.text.append(delta["content"])
            self._delta("text", 0, delta["content"])
        if isinstance(delta.get("refusal"), str):
            self.refusal.append(delta["refusal"])
        for key in ("reasoning_content", "reasoning"):
            if isinstance(delta.get(key), str):
                self.reasoning.setdefault(key, []).append(delta[key])
                self._delta("reasoning", 0, delta[key])
        if isinstance(delta.get("reasoning_details"), list):
            self.extra.setdefault("reasoning_details", []).extend(delta["reasoning_details"])
        for call in delta.get("tool_calls") or []:
            if isinstance(call, Mapping):
                self._call(call)

    def _call(self, part: Mapping[str, Any]) -> None:
        index = part.get("index", len(self.calls))
        call = self.calls.setdefault(
            index, {"id": None, "type": "function", "function": {"name": None, "arguments": ""}}
        )
        if part.get("id"):
            call["id"] = part["id"]
        if part.get("type"):
            call["type"] = part["type"]
        if "extra_content" in part:
            call["extra_content"] = part["extra_content"]
        fn = part.get("function")
        if isinstance(fn, Mapping):
            if fn.get("name"):
                call["function"]["name"] = (call["function"]["name"] or "") + fn["name"]
            if isinstance(fn.get("arguments"), str):
                call["function"]["arguments"] += fn["arguments"]
                self._delta("tool_args", index, fn["arguments"], call["id"])

    def blocks(self) -> list[Message]:
        out = super().blocks()
        for block in out:  # a call's id may come after its first argument fragment
            if block["kind"] == "tool_args" and not block.get("call_id"):
                block["call_id"] = self.calls.get(block["index"], {}).get("id") or ""
        return out

    def body(self) -> Message:
        if not self.done:  # [DONE] ends every complete stream (after the usage chunk)
            raise self._cut()
        message: Message = {"role": "assistant", "content": "".join(self.text) or None}
        if self.refusal:
            message["refusal"] = "".join(self.refusal)
        for key, parts in self.reasoning.items():
            message[key] = "".join(parts)
        message.update(self.extra)
        if self.calls:
            message["tool_calls"] = [self.calls[i] for i in sorted(self.calls)]
        body: Message = {
            **self.head,
            "choices": [{"index": 0, "message": message, "finish_reason": self.finish}],
        }
        if self.usage is not None:
            body["usage"] = self.usage
        return body


class ResponsesFold(Fold):
    """Responses API events: ``response.completed`` carries the whole response."""

    provider = "openai-responses"

    def __init__(self) -> None:
        super().__init__()
        self.final: Message | None = None
        self.call_ids: dict[str, str] = {}

    def feed(self, event: str | None, data: str) -> None:
        payload = self._json(data)
        if not isinstance(payload, Mapping):
            raise ModelResponseError(f"{self.provider}: a stream event is not an object")
        kind = payload.get("type", event)
        index = payload.get("output_index", 0)
        index = index if isinstance(index, int) else 0
        if kind == "response.output_item.added":
            item = payload.get("item")
            if isinstance(item, Mapping) and item.get("type") == "function_call":
                self.call_ids[str(item.get("id"))] = str(item.get("call_id") or "")
        elif kind == "response.output_text.delta":
            self._delta("text", index, payload.get("delta"))
        elif kind in ("response.reasoning_summary_text.delta", "response.reasoning_text.delta"):
            self._delta("reasoning", index, payload.get("delta"))
        elif kind == "response.function_call_arguments.delta":
            call_id = self.call_ids.get(str(payload.get("item_id")), "")
            self._delta("tool_args", index, payload.get("delta"), call_id)
        elif kind in ("response.completed", "response.incomplete"):
            response = payload.get("response")
            if not isinstance(response, dict):
                raise ModelResponseError(f"{self.provider}: {kind} carries no response object")
            self.final, self.done = response, True
        elif kind == "response.failed":
            response = payload.get("response")
            error = response.get("error") if isinstance(response, Mapping) else None
            raise _stream_error(self.provider, error or {"message": "response.failed"})
        elif kind == "error":
            raise _stream_error(self.provider, payload.get("error") or payload)

    def body(self) -> Message:
        if self.final is None:
            raise self._cut()
        return self.final


class AnthropicFold(Fold):
    """Messages API events, ``message_start`` to ``message_stop``."""

    provider = "anthropic"

    def __init__(self) -> None:
        super().__init__()
        self.message: Message | None = None
        self.content: dict[int, Message] = {}
        self.json_parts: dict[int, list[str]] = {}

    def feed(self, event: str | None, data: str) -> None:
        payload = self._json(data)
        if not isinstance(payload, Mapping):
            raise ModelResponseError(f"{self.provider}: a stream event is not an object")
        kind = payload.get("type", event)
        if kind == "error":
            raise _stream_error(self.provider, payload.get("error"))
        if kind == "message_start":
            message = payload.get("message")
            if not isinstance(message, dict):
                raise ModelResponseError(f"{self.provider}: message_start has no message")
            self.message = {**message, "content": []}
            return
        if kind == "ping":
            return
        if self.message is None:
            raise ModelResponseError(f"{self.provider}: {kind!r} before message_start")
        if kind == "content_block_start":
            self._start(payload)
        elif kind == "content_block_delta":
            self._block_delta(payload)
        elif kind == "message_delta":
            self._message_delta(payload)
        elif kind == "message_stop":
            self.done = True

    def _start(self, payload: Mapping[str, Any]) -> None:
        index = payload.get("index")
        block = payload.get("content_block")
        if not isinstance(index, int) or not isinstance(block, Mapping):
            raise ModelResponseError(f"{self.provider}: content_block_start without index/block")
        self.content[index] = dict(block)
        if block.get("type") in ("tool_use", "server_tool_use"):
            self.json_parts[index] = []

    def _block_delta(self, payload: Mapping[str, Any]) -> None:
        index = payload.get("index")
        delta = payload.get("delta")
        block = self.content.get(index) if isinstance(index, int) else None
        if block is None or not isinstance(delta, Mapping) or not isinstance(index, int):
            raise ModelResponseError(f"{self.provider}: a delta for an unopened block {index!r}")
        kind = delta.get("type")
        if kind == "text_delta":
            block["text"] = block.get("text", "") + str(delta.get("text", ""))
            self._delta("text", index, delta.get("text"))
        elif kind == "input_json_delta":
            self.json_parts.setdefault(index, []).append(str(delta.get("partial_json", "")))
            self._delta("tool_args", index, delta.get("partial_json"), block.get("id"))
        elif kind == "thinking_delta":
            block["thinking"] = block.get("thinking", "") + str(delta.get("thinking", ""))
            self._delta("reasoning", index, delta.get("thinking"))
        elif kind == "signature_delta":
            block["signature"] = block.get("signature", "") + str(delta.get("signature", ""))
        elif kind == "citations_delta":
            block.setdefault("citations", []).append(delta.get("citation"))

    def _message_delta(self, payload: Mapping[str, Any]) -> None:
        assert self.message is not None
        delta = payload.get("delta")
        if isinstance(delta, Mapping):
            for key, value in delta.items():
                self.message[key] = value
        usage = payload.get("usage")
        if isinstance(usage, Mapping):
            merged = dict(self.message.get("usage") or {})
            merged.update({k: v for k, v in usage.items() if v is not None})
            self.message["usage"] = merged

    def body(self) -> Message:
        if self.message is None or not self.done:
            raise self._cut()
        content: list[Message] = []
        for index in sorted(self.content):
            block = dict(self.content[index])
            if index in self.json_parts:
                raw = "".join(self.json_parts[index])
                try:
                    block["input"] = json.loads(raw) if raw.strip() else {}
                except ValueError:
                    raise ModelResponseError(
                        f"{self.provider}: the streamed input of tool call "
                        f"{block.get('id')!r} is not JSON: {raw[:200]!r}"
                    ) from None
            content.append(block)
        return {**self.message, "content": content}


def fold_bytes(fold: Fold, chunks: Iterable[bytes]) -> Message:
    """Feed every event of ``chunks`` to ``fold``; its body (raises if the stream was cut)."""
    parser = SseParser()
    for chunk in chunks:
        for event, data in parser.feed(chunk):
            fold.feed(event, data)
    for event, data in parser.close():
        fold.feed(event, data)
    return fold.body()
