"""Published MCP servers (PyPI: time, git, sqlite; npm: filesystem, memory, everything),
installed by ``python tests/mcp_servers.py``, driven through ``Runtime.arun`` with their
real tool schemas; every effect is checked outside fsm-agent (the git log, the file on
disk, the SQLite row, the memory file)."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import sqlite3
import subprocess
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

import pytest
from mcp_servers import executable

from fsm_agent import Budget, RunResult, Runtime, ScriptedModel, ToolRegistry
from fsm_agent._core.content import File, Image
from fsm_agent._errors import ConfigError
from fsm_agent.models._anthropic_messages import to_anthropic
from fsm_agent.tools._mcp import (
    McpServerStartError,
    list_mcp_tools,
    register_mcp_tools,
    stdio_client,
    suggested_effects,
)

PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR4nGNgAAAAAgABSK+kcQAAAABJRU5ErkJggg=="
)


def call(cid: str, name: str, args: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": cid,
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(args)},
    }


def batch(*calls: dict[str, Any]) -> dict[str, Any]:
    return {"role": "assistant", "content": None, "tool_calls": list(calls)}


DONE = {"role": "assistant", "content": "Done."}


def results(result: RunResult) -> list[dict[str, Any]]:
    out = []
    for m in result.messages:
        if m["role"] == "tool":
            content = m["content"]
            text = content if isinstance(content, str) else content[0]["text"]
            out.append(json.loads(text))
    return out


def sync(coro: Coroutine[Any, Any, Any]) -> Any:
    return asyncio.run(coro)


async def drive(
    command: list[str], decisions: list[Any], *, env: dict[str, str] | None = None, **register: Any
) -> tuple[RunResult, ToolRegistry]:
    async with stdio_client(*command, env=env) as client:
        infos = await list_mcp_tools(client)
        tools = ToolRegistry()
        options = {"effects": suggested_effects(infos), **register}
        await register_mcp_tools(tools, client, **options)
        runtime = Runtime(
            model=ScriptedModel(decisions),
            tools=tools,
            allowed_tools=set(tools.names()),
            budget=Budget(max_wall_clock_s=60),
        )
        return await runtime.arun("go"), tools


def test_time_server_answers_what_zoneinfo_says() -> None:
    from datetime import datetime
    from zoneinfo import ZoneInfo

    result, _ = sync(
        drive(
            [executable("time")],
            [
                batch(
                    call("c1", "get_current_time", {"timezone": "Asia/Kolkata"}),
                    call(
                        "c2",
                        "convert_time",
                        {
                            "source_timezone": "Europe/London",
                            "time": "12:00",
                            "target_timezone": "Asia/Tokyo",
                        },
                    ),
                    call("c3", "get_current_time", {"timezone": 5}),
                ),
                DONE,
            ],
        )
    )
    now, converted, bad = results(result)
    assert result.status == "done"
    value = now["value"]
    value = json.loads(value) if isinstance(value, str) else value
    offset = datetime.fromisoformat(value["datetime"]).utcoffset()
    assert offset == datetime.now(ZoneInfo("Asia/Kolkata")).utcoffset()
    conv = converted["value"]
    conv = json.loads(conv) if isinstance(conv, str) else conv
    assert conv["target"]["datetime"].endswith("+09:00")
    assert bad["error"] == "invalid_arguments"  # a number for a string never reaches it


def test_git_server_commits_and_the_git_log_shows_it(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    for key, value in (("user.email", "t@example.com"), ("user.name", "T")):
        subprocess.run(["git", "-C", str(repo), "config", key, value], check=True)
    (repo / "notes.txt").write_text("hello\n")
    r = str(repo)
    result, tools = sync(
        drive(
            [executable("git"), "--repository", r],
            [
                batch(call("c1", "git_add", {"repo_path": r, "files": ["notes.txt"]})),
                batch(
                    call(
                        "c2", "git_commit", {"repo_path": r, "message": "Add notes from fsm-agent"}
                    )
                ),
                batch(
                    call(
                        "c3", "git_log", {"repo_path": r, "max_count": 1, "start_timestamp": None}
                    ),
                    call("c4", "git_log", {"repo_path": r, "max_count": "1"}),
                    call("c5", "git_add", {"repo_path": r, "files": []}),
                ),
                DONE,
            ],
            rejected_on_error=lambda name, text: "validation error" in text,
        )
    )
    assert result.status == "done", result.detail
    log = subprocess.run(["git", "-C", r, "log", "--format=%s"], capture_output=True, text=True)
    assert log.stdout.strip() == "Add notes from fsm-agent"
    *_, logged, wrong_type, empty = results(result)
    assert "Add notes from fsm-agent" in json.dumps(logged["value"])  # anyOf [string, null]
    assert wrong_type["error"] == empty["error"] == "invalid_arguments"  # minItems, no coercion
    assert tools["git_commit"].effect == "write" and tools["git_log"].effect == "read"


def test_sqlite_server_inserts_the_row_sqlite3_reads(tmp_path: Path) -> None:
    db = tmp_path / "shop.db"
    result, _ = sync(
        drive(
            [executable("sqlite"), "--db-path", str(db)],
            [
                batch(
                    call(
                        "c1",
                        "create_table",
                        {"query": "CREATE TABLE orders (id TEXT, qty INTEGER)"},
                    )
                ),
                batch(call("c2", "write_query", {"query": "INSERT INTO orders VALUES ('A17', 3)"})),
                batch(call("c3", "read_query", {"query": "SELECT * FROM orders", "limit": 5})),
                DONE,
            ],
        )
    )
    assert result.status == "done", result.detail
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT id, qty FROM orders").fetchall() == [("A17", 3)]
    assert results(result)[-1]["error"] == "invalid_arguments"  # "limit" is no field of it


def test_filesystem_server_writes_the_file_and_returns_media_as_an_image(tmp_path: Path) -> None:
    (tmp_path / "pixel.png").write_bytes(PNG)
    target = tmp_path / "out" / "hello.txt"
    target.parent.mkdir()
    root = str(tmp_path)
    result, _ = sync(
        drive(
            [executable("filesystem"), root],
            [
                batch(
                    call("c1", "write_file", {"path": str(target), "content": "written by a tool"})
                ),
                batch(call("c2", "read_media_file", {"path": str(tmp_path / "pixel.png")})),
                batch(call("c3", "write_file", {"path": "/etc/fsm-agent-test", "content": "x"})),
                DONE,
            ],
        )
    )
    assert target.read_text() == "written by a tool"
    assert not Path("/etc/fsm-agent-test").exists()
    # The image reaches the model as an image: a content part, then an Anthropic block.
    media = next(
        m for m in result.messages if m["role"] == "tool" and isinstance(m["content"], list)
    )
    assert media["content"][1]["type"] == "image_url"
    _, turns = to_anthropic(result.messages)
    blocks = [b for t in turns for b in t["content"] if b.get("type") == "tool_result"]
    image = blocks[1]["content"][1]
    assert image["type"] == "image" and base64.b64decode(image["source"]["data"]) == PNG
    # Outside the allowed directory the server refuses; a write may have acted, so: review.
    assert (result.status, result.reason) == ("review_required", "outcome_unknown")


def test_memory_server_stores_the_entity_in_its_file(tmp_path: Path) -> None:
    memory = tmp_path / "memory.jsonl"
    entity = {"name": "order A17", "entityType": "order", "observations": ["in transit"]}
    result, _ = sync(
        drive(
            [executable("memory")],
            [
                batch(call("c1", "create_entities", {"entities": [entity]})),
                batch(
                    call("c2", "create_entities", {"entities": [{"name": "x", "approved": True}]})
                ),
                DONE,
            ],
            env={**os.environ, "MEMORY_FILE_PATH": str(memory)},
        )
    )
    assert result.status == "done", result.detail
    stored = [json.loads(line) for line in memory.read_text().splitlines()]
    assert [(s["name"], s["observations"]) for s in stored] == [("order A17", ["in transit"])]
    assert results(result)[1]["error"] == "invalid_arguments"  # missing and unknown fields


def test_everything_server_formats_images_resources_and_tasks(tmp_path: Path) -> None:
    exe = executable("everything")
    with pytest.raises(ConfigError, match=r"simulate-research-query can only run as MCP tasks"):
        sync(drive([exe], [DONE]))
    only = ["echo", "get-tiny-image", "gzip-file-as-resource"]
    data = "data:text/plain;base64," + base64.b64encode(b"hello " * 50).decode()
    result, _ = sync(
        drive(
            [exe],
            [
                batch(
                    call("c1", "get-tiny-image", {}),
                    call(
                        "c2",
                        "gzip-file-as-resource",
                        {"name": "a.gz", "data": data, "outputType": "resource"},
                    ),
                    call("c3", "echo", {"message": "hi"}),
                ),
                # the case: an invalid URI for a write tool is refused by the format
                # check before the server sees it, so no isError and no outcome_unknown
                batch(
                    call(
                        "c4",
                        "gzip-file-as-resource",
                        {"name": "b.gz", "data": "not a uri", "outputType": "resource"},
                    )
                ),
                DONE,
            ],
            only=only,
            effects={"echo": "read", "get-tiny-image": "read", "gzip-file-as-resource": "write"},
        )
    )
    assert result.status == "done", result.detail
    image, _gz, echoed, refused = results(result)
    assert "image" in json.dumps(image["value"]) and echoed["ok"]
    assert refused["error"] == "invalid_arguments" and "is not a 'uri'" in refused["detail"]
    tool_messages = [m for m in result.messages if m["role"] == "tool"]
    assert [p["type"] for p in tool_messages[0]["content"]][1] == "image_url"
    gz_part = tool_messages[1]["content"][1]
    assert gz_part["type"] == "file" and gz_part["file"]["filename"] == "a.gz"


def test_a_server_that_cannot_start_names_its_command_and_stderr() -> None:
    exe = executable("git")
    with pytest.raises(McpServerStartError) as caught:
        sync(drive([exe, "--no-such-option"], [DONE]))
    text = str(caught.value)
    assert "mcp-server-git --no-such-option" in text and "No such option" in text
    assert not getattr(caught.value, "exceptions", None)  # not an exception group


def test_values_are_images_and_files() -> None:
    assert isinstance(Image(PNG), Image) and File(b"x", "text/plain").name is None
