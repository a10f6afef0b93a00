"""The recorded provider examples replay through their adapters, request for request."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType

import pytest

EXAMPLES = Path(__file__).parents[1] / "examples" / "providers"


def replay() -> ModuleType:
    spec = importlib.util.spec_from_file_location("replay", EXAMPLES / "replay.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("name", ["openai_chat", "openai_responses", "anthropic"])
def test_recording_replays(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert replay().main([str(EXAMPLES / f"{name}.json")]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert (summary["status"], summary["answer"]) == ("done", "Order A17 is in transit.")
    assert summary["tokens"] > 0 and summary["cost"] > 0


def test_a_changed_translation_is_caught(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    recording = json.loads((EXAMPLES / "anthropic.json").read_text())
    recording["exchanges"][1]["request"]["messages"][1]["content"][1]["id"] = "toolu_other"
    path = tmp_path / "tampered.json"
    path.write_text(json.dumps(recording))
    assert replay().main([str(path)]) == 1
    assert "requests differing from the recording: [1]" in capsys.readouterr().err


def test_an_unreadable_recording_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "broken.json"
    path.write_text("{not json")
    assert replay().main([str(path)]) == 2
    assert capsys.readouterr().err.startswith(f"replay: cannot read {path}")
