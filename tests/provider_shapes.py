"""Response bodies in each provider's JSON, and the adapter under test for each.

One class per API with the same methods, so the behaviour every adapter must share is
tested once, parametrized over the three APIs.
"""

from __future__ import annotations

import json
from typing import Any

import anthropic
import openai

from fsm_agent.models import (
    AnthropicModel,
    AsyncAnthropicModel,
    AsyncOpenAIChatModel,
    AsyncOpenAIResponsesModel,
    OpenAIChatModel,
    OpenAIResponsesModel,
)

Call = tuple[str | None, str, Any]  # (id, tool name, arguments as a JSON value)


class ChatApi:
    name = "openai-chat"
    path = "/v1/chat/completions"
    model = "gpt-4o-mini"

    def adapter(self, url: str, **kw: Any) -> OpenAIChatModel:
        client = openai.OpenAI(base_url=url + "/v1", api_key="test", max_retries=0)
        return OpenAIChatModel(kw.pop("model", self.model), client=client, **kw)

    def async_adapter(self, url: str, **kw: Any) -> AsyncOpenAIChatModel:
        client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="test", max_retries=0)
        return AsyncOpenAIChatModel(self.model, client=client, **kw)

    def usage(self, inp: int, out: int) -> dict[str, Any]:
        return {"prompt_tokens": inp, "completion_tokens": out, "total_tokens": inp + out}

    def text(self, text: str, *, usage: tuple[int, int] = (10, 5)) -> dict[str, Any]:
        return {
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "model": "gpt-4o-mini-2024-07-18",
            "choices": [
                {
                    "index": 0,
                    "finish_reason": "stop",
                    "message": {"role": "assistant", "content": text},
                }
            ],
            "usage": self.usage(*usage),
        }

    def calls(self, calls: list[Call], *, usage: tuple[int, int] = (10, 5)) -> dict[str, Any]:
        tool_calls = [
            {
                "type": "function",
                "function": {
                    "name": name,
                    "arguments": args if isinstance(args, str) else json.dumps(args),
                },
                **({"id": cid} if cid is not None else {}),
            }
            for cid, name, args in calls
        ]
        return {
            "id": "chatcmpl-2",
            "object": "chat.completion",
            "model": "gpt-4o-mini",
            "choices": [
                {
                    "index": 0,
                    "finish_reason": "tool_calls",
                    "message": {"role": "assistant", "content": None, "tool_calls": tool_calls},
                }
            ],
            "usage": self.usage(*usage),
        }

    def stopped(self, body: dict[str, Any], reason: str) -> dict[str, Any]:
        body["choices"][0]["finish_reason"] = reason
        return body

    def sent_messages(self, request: dict[str, Any]) -> list[Any]:
        return list(request["messages"])


class ResponsesApi:
    name = "openai-responses"
    path = "/v1/responses"
    model = "gpt-4.1-mini"

    def adapter(self, url: str, **kw: Any) -> OpenAIResponsesModel:
        client = openai.OpenAI(base_url=url + "/v1", api_key="test", max_retries=0)
        return OpenAIResponsesModel(kw.pop("model", self.model), client=client, **kw)

    def async_adapter(self, url: str, **kw: Any) -> AsyncOpenAIResponsesModel:
        client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="test", max_retries=0)
        return AsyncOpenAIResponsesModel(self.model, client=client, **kw)

    def usage(self, inp: int, out: int) -> dict[str, Any]:
        return {"input_tokens": inp, "output_tokens": out, "total_tokens": inp + out}

    def text(self, text: str, *, usage: tuple[int, int] = (10, 5)) -> dict[str, Any]:
        return {
            "id": "resp_1",
            "object": "response",
            "status": "completed",
            "model": "gpt-4.1-mini-2025-04-14",
            "output": [
                {
                    "type": "message",
                    "id": "msg_1",
                    "role": "assistant",
                    "content": [{"type": "output_text", "text": text}],
                }
            ],
            "usage": self.usage(*usage),
        }

    def calls(self, calls: list[Call], *, usage: tuple[int, int] = (10, 5)) -> dict[str, Any]:
        output = [
            {
                "type": "function_call",
                "id": f"fc_{i}",
                "name": name,
                "arguments": args if isinstance(args, str) else json.dumps(args),
                **({"call_id": cid} if cid is not None else {}),
            }
            for i, (cid, name, args) in enumerate(calls)
        ]
        return {
            "id": "resp_2",
            "object": "response",
            "status": "completed",
            "model": "gpt-4.1-mini",
            "output": [{"type": "reasoning", "id": "rs_1", "summary": []}, *output],
            "usage": self.usage(*usage),
        }

    def stopped(self, body: dict[str, Any], reason: str) -> dict[str, Any]:
        body["status"] = reason
        return body

    def sent_messages(self, request: dict[str, Any]) -> list[Any]:
        return list(request["input"])


class AnthropicApi:
    name = "anthropic"
    path = "/v1/messages"
    model = "claude-haiku-4-5"

    def adapter(self, url: str, **kw: Any) -> AnthropicModel:
        client = anthropic.Anthropic(base_url=url, api_key="test", max_retries=0)
        return AnthropicModel(kw.pop("model", self.model), client=client, **kw)

    def async_adapter(self, url: str, **kw: Any) -> AsyncAnthropicModel:
        client = anthropic.AsyncAnthropic(base_url=url, api_key="test", max_retries=0)
        return AsyncAnthropicModel(self.model, client=client, **kw)

    def usage(self, inp: int, out: int) -> dict[str, Any]:
        return {"input_tokens": inp, "output_tokens": out}

    def text(self, text: str, *, usage: tuple[int, int] = (10, 5)) -> dict[str, Any]:
        return {
            "id": "msg_1",
            "type": "message",
            "role": "assistant",
            "model": "claude-haiku-4-5-20251001",
            "stop_reason": "end_turn",
            "content": [{"type": "text", "text": text}],
            "usage": self.usage(*usage),
        }

    def calls(self, calls: list[Call], *, usage: tuple[int, int] = (10, 5)) -> dict[str, Any]:
        content = [
            {
                "type": "tool_use",
                "name": name,
                "input": json.loads(args) if isinstance(args, str) else args,
                **({"id": cid} if cid is not None else {}),
            }
            for cid, name, args in calls
        ]
        return {
            "id": "msg_2",
            "type": "message",
            "role": "assistant",
            "model": "claude-haiku-4-5",
            "stop_reason": "tool_use",
            "content": [{"type": "text", "text": "Let me check."}, *content],
            "usage": self.usage(*usage),
        }

    def stopped(self, body: dict[str, Any], reason: str) -> dict[str, Any]:
        body["stop_reason"] = reason
        return body

    def sent_messages(self, request: dict[str, Any]) -> list[Any]:
        return list(request["messages"])


APIS = [ChatApi(), ResponsesApi(), AnthropicApi()]
