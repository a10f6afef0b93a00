"""Every file the command line writes: never one of its inputs (same path, symbolic or
hard link: exit 2 and the input untouched), and written whole or not at all."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from conftest import Backend, make_runtime, say

from fsm_agent._cli import main
from fsm_agent._cli._output import write_output
from fsm_agent._durable.sqlite import SqliteStore
from fsm_agent._errors import UsageError


@pytest.fixture
def db(tmp_path: Path, backend: Backend) -> Path:
    path = tmp_path / "runs.db"
    with SqliteStore(path) as store:
        make_runtime([say("Hello.")], backend, store=store).run("hi", run_id="r1")
    return path


@pytest.fixture
def trace(tmp_path: Path, backend: Backend) -> Path:
    path = tmp_path / "t.jsonl"
    result = make_runtime([say("Hello.")], backend).run("hi")
    from fsm_agent._trace.chain import dumps_event

    path.write_text("".join(dumps_event(e) + "\n" for e in result.events), encoding="utf-8")
    return path


def _links(target: Path, how: str) -> Path:
    """``target`` itself, a symbolic link to it, or a hard link to it."""
    if how == "same":
        return target
    link = target.with_name("link-" + target.name)
    if how == "symlink":
        link.symlink_to(target.name)
    else:
        os.link(target, link)
    return link


@pytest.mark.parametrize("how", ["same", "symlink", "hardlink"])
@pytest.mark.parametrize("suffix", ["", "-wal"])
def test_export_refuses_to_write_over_its_store(
    db: Path, how: str, suffix: str, capsys: pytest.CaptureFixture[str]
) -> None:
    if suffix:  # the write-ahead log is part of the store too
        target = Path(str(db) + suffix)
        target.write_bytes(b"wal")
    else:
        target = db
    before = target.read_bytes()
    out = _links(target, how)
    code = main(["runs", "export", "--db", str(db), "r1", "-o", str(out)])
    err = capsys.readouterr().err
    assert code == 2, err
    assert f"-o {out}" in err and "the input --db" in err and "choose another output" in err
    assert target.read_bytes() == before
    if not suffix:
        with SqliteStore(db, create=False, readonly=True) as store:
            assert store.load_run("r1").events  # the store is whole


@pytest.mark.parametrize("how", ["same", "symlink", "hardlink"])
@pytest.mark.parametrize("flag", ["--html", "-o"])
def test_replay_refuses_to_write_over_its_trace(
    trace: Path, how: str, flag: str, capsys: pytest.CaptureFixture[str]
) -> None:
    before = trace.read_bytes()
    out = _links(trace, how)
    extra = ["--format", "dot"] if flag == "-o" else []
    code = main(["replay", str(trace), flag, str(out), *extra])
    err = capsys.readouterr().err
    assert code == 2, err
    assert f"{flag} {out}" in err and "the input TRACE" in err
    assert trace.read_bytes() == before


def test_replay_refuses_one_file_for_both_outputs(
    trace: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "view.html"
    code = main(["replay", str(trace), "-o", str(out), "--format", "dot", "--html", str(out)])
    assert code == 2 and "the input -o" in capsys.readouterr().err
    assert not out.exists()


def test_aggregate_refuses_any_of_its_traces(
    trace: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    other = tmp_path / "u.jsonl"
    other.write_bytes(trace.read_bytes())
    code = main(["replay", str(trace), str(other), "--aggregate", "-o", str(other)])
    assert code == 2 and "the input TRACE" in capsys.readouterr().err


def test_export_and_replay_still_write_new_files(
    db: Path, trace: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "r1.jsonl"
    assert main(["runs", "export", "--db", str(db), "r1", "-o", str(out)]) == 0
    assert main(["check", str(out)]) == 0
    page = tmp_path / "view.html"
    assert main(["replay", str(out), "--html", str(page)]) == 0
    assert page.read_text(encoding="utf-8").startswith("<!DOCTYPE html>")
    # replacing an earlier output is fine, and keeps that file's permissions
    os.chmod(page, 0o640)
    assert main(["replay", str(out), "--html", str(page)]) == 0
    assert page.stat().st_mode & 0o777 == 0o640
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_an_output_through_a_symlink_replaces_the_file_it_points_at(tmp_path: Path) -> None:
    real = tmp_path / "real.txt"
    real.write_text("old")
    link = tmp_path / "link.txt"
    link.symlink_to(real.name)
    write_output("-o", str(link), b"new")
    assert link.is_symlink() and real.read_text() == "new"


def test_a_failed_write_leaves_the_old_file_and_no_temporary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "out.svg"
    target.write_text("old")

    def broken_replace(src: str, dst: str) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", broken_replace)
    with pytest.raises(UsageError, match=r"cannot write -o .*out.svg: No space left on device"):
        write_output("-o", str(target), b"new")
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["out.svg"]


def test_an_output_in_a_missing_folder_is_one_line(
    trace: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "no" / "such" / "view.html"
    assert main(["replay", str(trace), "--html", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "cannot write --html" in err and "No such file" in err


def test_a_device_or_a_folder_as_output(
    trace: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A device cannot be replaced by a rename: it is written to, as before.
    assert main(["replay", str(trace), "-o", os.devnull, "--format", "dot"]) == 0
    assert main(["replay", str(trace), "-o", str(tmp_path), "--format", "dot"]) == 2
    assert "it is a folder; name a file" in capsys.readouterr().err


def test_export_refuses_a_standard_output_that_is_its_store(db: Path) -> None:
    """``runs export R --db runs.db >> runs.db`` would append the trace to the store."""
    import subprocess
    import sys

    before = db.read_bytes()
    with open(db, "ab") as out:
        done = subprocess.run(
            [sys.executable, "-m", "fsm_agent", "runs", "export", "--db", str(db), "r1"],
            stdout=out,
            stderr=subprocess.PIPE,
            text=True,
            check=False,
        )
    assert done.returncode == 2, done.stderr
    assert "standard output is the input --db" in done.stderr
    assert db.read_bytes() == before
