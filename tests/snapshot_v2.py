"""The stored layout-2 run of ``tests/data/run_snapshot_v2.json``, under today's table.

The fixture was written by the engine before v3 (commit 9c99780), under the transition
table of its day. What its tests check is the *layout* (a layout-2 checkpoint restores,
and is rewritten at layout 3), not that table: so the machine hash it records is moved to
today's default table, and the checkpoint's CRC-32 recomputed, as the engine of its day
would have written it had the table been today's. (Before v3 there was no release, so
no stored run under the old table needs to resume: see CHANGELOG.)
"""

from __future__ import annotations

import json
import zlib
from pathlib import Path
from typing import Any

from fsm_agent._core.table import MACHINE_HASH

_FILE = Path(__file__).parent / "data" / "run_snapshot_v2.json"


def load_v2() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(_FILE.read_text())
    old = data["header"]["machine_hash"]
    data["header"]["machine_hash"] = MACHINE_HASH
    for event in data["events"]:
        if event.get("machine_hash") == old:
            event["machine_hash"] = MACHINE_HASH
    body = data["snapshot"]["body"]
    body["machine_hash"] = MACHINE_HASH
    text = json.dumps(body, separators=(",", ":"), ensure_ascii=False)  # as the engine sums it
    data["snapshot"]["checksum"] = f"crc32:{zlib.crc32(text.encode('utf-8')):08x}"
    return data
