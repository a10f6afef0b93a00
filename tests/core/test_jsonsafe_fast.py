"""``dumps_safe`` encodes with one C encoder built once and ``copy_json`` reads with the C
scanner (the hot path's JSON, twice per tool round): exactly what ``json.dumps`` and
``json.loads`` give, and every value that is not JSON still goes through the R12 policy."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

from fsm_agent._core.jsonsafe import MAX_DEPTH, clean_text, copy_json, dumps_safe

PLAIN: list[Any] = [
    None, True, 0, -7, 2.5, 1e300, "", "é ü 中 😀", 'quote " back \\ slash \n\t\x01',
    [], {}, [1, [2, [3]]], {"a": {"b": [None, False, 1.0]}, "k": "v"},
    {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function",
     "function": {"name": "lookup", "arguments": "{\"order_id\": \"A1\"}"}}]},
]  # fmt: skip


@pytest.mark.parametrize("value", PLAIN)
def test_plain_data_is_encoded_as_json_dumps_does(value: Any) -> None:
    text, data, changed = dumps_safe(value)
    assert text == json.dumps(value, ensure_ascii=False, allow_nan=False)
    assert data == text.encode("utf-8") and changed is False
    assert copy_json(text) == json.loads(text)


def test_what_is_not_json_still_follows_the_policy() -> None:
    cyclic: list[Any] = [1]
    cyclic.append(cyclic)
    assert dumps_safe(cyclic)[0] == '[1, "<cycle>"]' and dumps_safe(cyclic)[2] is True
    assert dumps_safe({"x": math.nan})[0] == '{"x": "NaN"}'
    assert dumps_safe({"s": "a\ud800b"})[0] == '{"s": "a\ufffdb"}'
    assert dumps_safe({1: object})[2] is True
    deep: Any = []
    for _ in range(MAX_DEPTH + 5):
        deep = [deep]
    assert "<nested deeper than" in dumps_safe(deep)[0]


def test_a_copy_is_a_fresh_value() -> None:
    value = {"ok": True, "value": {"items": [1, 2]}}
    copy = copy_json(dumps_safe(value)[0])
    assert copy == value and copy["value"] is not value["value"]


def test_clean_text_keeps_ascii_and_repairs_lone_surrogates() -> None:
    text = "plain ascii"
    assert clean_text(text) is text
    assert clean_text("é\udc80") == "é\ufffd"
