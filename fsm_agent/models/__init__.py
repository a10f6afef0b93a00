"""Models: anything callable as ``(messages, tool_specs) -> assistant message dict``.

The provider adapters load their SDK only when first named here, so ``import
fsm_agent`` works without the optional extras (``fsm-agent[openai]``, ``[anthropic]``).
"""

from __future__ import annotations

import importlib
from typing import Any

from fsm_agent.models._chat_history import to_openai_chat
from fsm_agent.models._common import (
    HistoryError,
    ModelAuthError,
    ModelError,
    ModelRequestError,
    ModelResponseError,
    ModelRetry,
    ModelUnavailableError,
)
from fsm_agent.models._pricing import DEFAULT_PRICES, Price
from fsm_agent.models._scripted import KeyedScriptedModel, ScriptedModel, StreamingScriptedModel
from fsm_agent.models._validate import (
    check_anthropic_messages,
    check_anthropic_request,
    check_openai_chat,
    check_openai_chat_request,
    check_openai_responses,
    check_openai_responses_request,
)

__all__ = [
    "DEFAULT_PRICES",
    "AnthropicModel",
    "AsyncAnthropicModel",
    "AsyncOpenAIChatModel",
    "AsyncOpenAIResponsesModel",
    "HistoryError",
    "KeyedScriptedModel",
    "ModelAuthError",
    "ModelError",
    "ModelRequestError",
    "ModelResponseError",
    "ModelRetry",
    "ModelUnavailableError",
    "OpenAIChatModel",
    "OpenAIResponsesModel",
    "Price",
    "ScriptedModel",
    "StreamingScriptedModel",
    "check_anthropic_messages",
    "check_anthropic_request",
    "check_openai_chat",
    "check_openai_chat_request",
    "check_openai_responses",
    "check_openai_responses_request",
    "to_openai_chat",
]

_LAZY = {
    "OpenAIChatModel": "_openai_chat",
    "AsyncOpenAIChatModel": "_openai_chat",
    "OpenAIResponsesModel": "_openai_responses",
    "AsyncOpenAIResponsesModel": "_openai_responses",
    "AnthropicModel": "_anthropic_messages",
    "AsyncAnthropicModel": "_anthropic_messages",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'fsm_agent.models' has no attribute {name!r}")
    return getattr(importlib.import_module(f"fsm_agent.models.{module}"), name)
