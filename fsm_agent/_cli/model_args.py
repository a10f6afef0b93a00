"""Command-line flags that pick a real model: ``--model openai-compatible --base-url URL``.

Used by ``fsm-agent demo``; any command can call :func:`add_model_arguments` and
:func:`model_from_args`. Every bad flag raises :class:`ModelArgsError` with a one-line
message (the command prints it and exits 2); nothing here touches the network.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
from typing import Any
from urllib.parse import urlsplit

from fsm_agent._errors import ModelArgsError
from fsm_agent.models._common import ModelRetry

__all__ = ["MODEL_KINDS", "ModelArgsError", "add_model_arguments", "model_from_args"]

#: kind -> (SDK module, extra name, default model name, default API key variable)
_KINDS: dict[str, tuple[str, str, str, str]] = {
    "openai-compatible": ("openai", "openai", "gpt-4o-mini", "OPENAI_API_KEY"),
    "openai-responses": ("openai", "openai", "gpt-4o-mini", "OPENAI_API_KEY"),
    "anthropic": ("anthropic", "anthropic", "claude-haiku-4-5", "ANTHROPIC_API_KEY"),
}
MODEL_KINDS = ("scripted", *_KINDS)

#: A key for local servers that ignore it (vLLM, llama.cpp, Ollama); the SDKs need one.
_NO_KEY = "unused"


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("real models (default: the scenario's scripted model)")
    group.add_argument(
        "--model",
        choices=MODEL_KINDS,
        default="scripted",
        help="which model answers: the script, or a provider API",
    )
    group.add_argument(
        "--base-url",
        metavar="URL",
        help="the API's base URL (OpenAI-style servers usually end in /v1)",
    )
    group.add_argument(
        "--model-name",
        metavar="NAME",
        help="the provider's model name (default: gpt-4o-mini / claude-haiku-4-5)",
    )
    group.add_argument(
        "--api-key-env",
        metavar="VAR",
        help="environment variable holding the API key (default: "
        "OPENAI_API_KEY / ANTHROPIC_API_KEY; optional with --base-url)",
    )
    group.add_argument(
        "--synthesize-missing-ids",
        action="store_true",
        help="openai-compatible only: mint stable ids for tool calls the server sends "
        "without one (Gemini's OpenAI endpoint sends empty ids); without it such a reply "
        "stops the run protocol_error/missing_tool_call_id",
    )
    group.add_argument(
        "--request-timeout",
        metavar="SECONDS",
        type=float,
        default=60.0,
        help="timeout of one model request (default: 60)",
    )


def _api_key(args: argparse.Namespace, default_var: str) -> str:
    if args.api_key_env is not None:
        key = os.environ.get(args.api_key_env)
        if not key:
            raise ModelArgsError(
                f"--api-key-env: environment variable {args.api_key_env} is not set"
            )
        return key
    key = os.environ.get(default_var)
    if key:
        return key
    if args.base_url is not None:
        return _NO_KEY
    raise ModelArgsError(
        f"--model {args.model}: set {default_var}, or name the key's "
        f"variable with --api-key-env VAR"
    )


def model_from_args(args: argparse.Namespace) -> Any:
    """The model the flags ask for, or ``None`` for the scripted default."""
    kind = args.model
    if kind == "scripted":
        given = [
            flag
            for flag, value in (
                ("--base-url", args.base_url),
                ("--model-name", args.model_name),
                ("--api-key-env", args.api_key_env),
                ("--synthesize-missing-ids", getattr(args, "synthesize_missing_ids", False)),
            )
            if value
        ]
        if given:
            raise ModelArgsError(f"{', '.join(given)} needs --model {'|'.join(MODEL_KINDS[1:])}")
        return None
    sdk, extra, default_name, default_var = _KINDS[kind]
    synthesize = bool(getattr(args, "synthesize_missing_ids", False))
    if synthesize and kind != "openai-compatible":
        raise ModelArgsError(
            f"--synthesize-missing-ids is for --model openai-compatible (Chat Completions "
            f"servers), not --model {kind}"
        )
    if args.base_url is not None:
        parts = urlsplit(args.base_url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ModelArgsError(f"--base-url must be an http(s) URL, got {args.base_url!r}")
    timeout = args.request_timeout
    if not timeout > 0:
        raise ModelArgsError(f"--request-timeout must be > 0, got {timeout}")
    if importlib.util.find_spec(sdk) is None:
        raise ModelArgsError(
            f"--model {kind} needs the {sdk} SDK: pip install 'fsm-agent[{extra}]'"
        )
    key = _api_key(args, default_var)
    name = args.model_name or default_name
    retry = ModelRetry(max_attempts=2, request_timeout_s=timeout)
    if kind == "anthropic":
        from fsm_agent.models._anthropic_messages import AnthropicModel

        return AnthropicModel(name, base_url=args.base_url, api_key=key, retry=retry)
    if kind == "openai-responses":
        from fsm_agent.models._openai_responses import OpenAIResponsesModel

        return OpenAIResponsesModel(name, base_url=args.base_url, api_key=key, retry=retry)
    from fsm_agent.models._openai_chat import OpenAIChatModel

    return OpenAIChatModel(
        name,
        base_url=args.base_url,
        api_key=key,
        retry=retry,
        synthesize_missing_ids=synthesize,
    )
