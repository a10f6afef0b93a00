"""``fsm-agent keys`` and the refusals of ``fsm-agent serve`` (the server itself is
tested through HTTP in test_server_api.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import Backend, call, calls, make_runtime, say

from fsm_agent.cli import main
from fsm_agent.durable.feed import parse_key
from fsm_agent.durable.sqlite import SqliteStore


@pytest.fixture
def db(tmp_path: Path) -> str:
    path = tmp_path / "runs.db"
    with SqliteStore(path) as store:
        rt = make_runtime(
            [calls(call("c1", "write", request_id="R-1", title="t")), say("ok")],
            Backend(),
            store=store,
            approval=True,
        )
        rt.run("go", run_id="r1")
    return str(path)


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    return code, out, err


def test_keys_add_shows_the_key_once_and_list_never(
    db: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(capsys, "keys", "add", "alice", "--scope", "review", "--db", db)
    assert code == 0 and "shown once" in err
    key = out.strip()
    parsed = parse_key(key)
    assert parsed is not None
    code, out, _ = run(capsys, "keys", "list", "--db", db)
    assert code == 0 and "alice" in out and "review" in out and "active" in out
    assert parsed[1] not in out
    with SqliteStore(db) as store:
        (record,) = store.list_keys()
        assert parsed[1] not in (record.digest, record.salt)
    code, _, err = run(capsys, "keys", "add", "alice", "--scope", "read", "--db", db)
    assert code == 2 and "a key named 'alice' exists" in err
    code, out, _ = run(capsys, "keys", "revoke", "alice", "--db", db)
    assert code == 0 and "revoked" in out
    code, out, _ = run(capsys, "keys", "list", "--db", db)
    assert "revoked" in out
    code, _, err = run(capsys, "keys", "revoke", "alice", "--db", db)
    assert code == 1 and "no active key named 'alice'" in err


def test_bad_key_input_is_one_line(
    db: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run(capsys, "keys", "add", "a b", "--scope", "read", "--db", db)
    assert code == 2 and "key name 'a b'" in err
    missing = str(tmp_path / "nope.db")
    code, _, err = run(capsys, "keys", "add", "bob", "--scope", "read", "--db", missing)
    assert code == 2 and "no such database" in err and err.startswith("fsm-agent keys: ")


def test_serve_refuses_to_listen_beyond_loopback_with_no_keys(
    db: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run(capsys, "serve", "--db", db, "--host", "0.0.0.0", "--port", "1")
    assert code == 2 and "refusing to listen on 0.0.0.0 with no API keys" in err
    code, _, err = run(capsys, "serve", "--db", db, "--app", "nope", "--port", "1")
    assert code == 2 and "--app must be MODULE:FUNCTION" in err
    assert err.startswith("fsm-agent serve: ")
