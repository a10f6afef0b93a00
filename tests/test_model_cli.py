"""``fsm-agent demo --model ...`` against the loopback provider: the happy scenario with a
real adapter, and every bad flag as a one-line message with exit code 2."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from typing import Any

import pytest
from fake_provider import FakeProvider
from provider_shapes import APIS, ChatApi

from fsm_agent._cli import main

FLAG = {
    "openai-chat": "openai-compatible",
    "openai-responses": "openai-responses",
    "anthropic": "anthropic",
}


@pytest.fixture
def server() -> Iterator[FakeProvider]:
    with FakeProvider() as s:
        yield s


def summary(out: str) -> dict[str, Any]:
    lines = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    return next(line for line in lines if line.get("type") == "summary")


@pytest.mark.parametrize("api", APIS, ids=lambda a: a.name)
def test_demo_happy_against_a_compatible_server(
    api: Any,
    server: FakeProvider,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("MY_KEY", "sk-test-123")
    server.queue(
        api.calls([("call_s1", "search", {"query": "order A17"})]),
        api.text("Order A17 is in transit."),
    )
    base = server.url + ("" if api.name == "anthropic" else "/v1")
    code = main(
        [
            "demo",
            "--model",
            FLAG[api.name],
            "--base-url",
            base,
            "--model-name",
            "served-model",
            "--api-key-env",
            "MY_KEY",
            "--quiet",
            "--json",
        ]
    )
    out = capsys.readouterr()
    assert code == 0, out.err
    s = summary(out.out)
    assert (s["scenario"], s["ok"], s["status"]) == ("happy", True, "done")
    first, second = (r.body for r in server.received)
    assert first["model"] == "served-model"
    assert "A17 left the Shanghai warehouse" in json.dumps(second)  # the search result went back
    headers = {k.lower(): v for k, v in server.received[0].headers.items()}
    assert "sk-test-123" in (headers.get("authorization", "") + headers.get("x-api-key", ""))


def test_demo_reports_an_unreachable_server_as_a_failed_scenario(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    code = main(
        [
            "demo",
            "--model",
            "openai-compatible",
            "--base-url",
            f"http://127.0.0.1:{port}/v1",
            "--quiet",
            "--json",
            "--request-timeout",
            "2",
        ]
    )
    out = capsys.readouterr()
    assert code == 1
    end = summary(out.out)
    assert (end["status"], end["reason"]) == ("protocol_error", "model_error")


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--base-url", "http://x"], "--base-url needs --model"),
        (
            ["--model", "openai-compatible", "--base-url", "localhost:8000"],
            "--base-url must be an http(s) URL",
        ),
        (
            ["--model", "anthropic", "--base-url", "http://x", "--api-key-env", "NOPE_UNSET_VAR"],
            "environment variable NOPE_UNSET_VAR is not set",
        ),
        (
            ["--model", "openai-compatible", "--base-url", "http://x", "--request-timeout", "0"],
            "--request-timeout must be > 0",
        ),
        (["--synthesize-missing-ids"], "--synthesize-missing-ids needs --model"),
        (
            ["--model", "anthropic", "--base-url", "http://x", "--synthesize-missing-ids"],
            "--synthesize-missing-ids is for --model openai-compatible",
        ),
    ],
)
def test_bad_model_flags_exit_2(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["demo", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("demo: ") and message in err and "\n" not in err


def test_missing_default_key_without_base_url(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    assert main(["demo", "--model", "openai-responses"]) == 2
    assert "set OPENAI_API_KEY" in capsys.readouterr().err


def test_empty_call_ids_are_handled_as_documented_from_the_command_line(
    server: FakeProvider, capsys: pytest.CaptureFixture[str]
) -> None:
    """A server that sends empty ids (Gemini's OpenAI endpoint): the run stops naming the
    fix a command-line user can apply, and with that flag it runs."""
    chat = ChatApi()
    argv = ["demo", "--model", "openai-compatible", "--base-url", server.url + "/v1"]
    server.queue(chat.calls([("", "search", {"query": "order A17"})]))
    assert main([*argv, "--json"]) == 1
    out = capsys.readouterr().out
    end = summary(out)
    assert (end["status"], end["reason"]) == ("protocol_error", "missing_tool_call_id")
    stop = next(e for e in map(json.loads, out.splitlines()) if e.get("type") == "run_end")
    assert "or --synthesize-missing-ids to fsm-agent" in stop["detail"]
    server.queue(
        chat.calls([("", "search", {"query": "order A17"})]),
        chat.text("Order A17 is in transit."),
    )
    assert main([*argv, "--synthesize-missing-ids", "--quiet", "--json"]) == 0
    end = summary(capsys.readouterr().out)
    assert (end["status"], end["ok"]) == ("done", True)
    assert server.received[-1].body["messages"][2]["tool_call_id"] == ""  # its own id back
