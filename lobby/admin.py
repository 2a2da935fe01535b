"""`lobby agents | mailbox AGENT_ID | transactions`: read the store of a lobby, running or not.

The store is opened read-only (WAL lets it be read while the lobby writes). Output is a table
for people or, with `--json`, one JSON document for scripts. Tokens are not in the store (only
their hashes) and are never printed.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson

from lobby.store.sqlite import FILE_NAME


class StoreNotFound(Exception):
    pass


def open_readonly(data_dir: Path) -> sqlite3.Connection:
    path = data_dir / FILE_NAME
    if not path.exists():
        raise StoreNotFound(f"no lobby store at {path} (is --data-dir right?)")
    return sqlite3.connect(f"file:{path}?mode=ro", uri=True)


def agents(db: sqlite3.Connection) -> list[dict[str, Any]]:
    rows = db.execute(
        """
        SELECT a.agent_id, a.capabilities, a.acks,
               (SELECT count(*) FROM messages m WHERE m.receiver = a.agent_id
                  AND m.seq > coalesce((SELECT up_to FROM acks k WHERE k.receiver = a.agent_id), 0))
        FROM agents a ORDER BY a.agent_id
        """
    )
    return [
        {
            "agent_id": agent_id,
            "capabilities": [c["name"] for c in orjson.loads(capabilities)],
            "acks": bool(acks),
            "held_messages": held,
        }
        for agent_id, capabilities, acks, held in rows
    ]


def mailbox(db: sqlite3.Connection, agent_id: str) -> list[dict[str, Any]]:
    row = db.execute("SELECT up_to FROM acks WHERE receiver = ?", (agent_id,)).fetchone()
    acked = row[0] if row else 0
    rows = db.execute(
        "SELECT seq, sender, message_id, conversation_id, frame, at FROM messages"
        " WHERE receiver = ? AND seq > ? ORDER BY seq",
        (agent_id, acked),
    )
    return [
        {
            "seq": seq,
            "sender_id": sender,
            "message_type": orjson.loads(frame).get("message_type"),
            "message_id": message_id,
            "conversation_id": conversation_id,
            "accepted_at": datetime.fromtimestamp(at, UTC).isoformat(),
        }
        for seq, sender, message_id, conversation_id, frame, at in rows
    ]


def transactions(db: sqlite3.Connection) -> list[dict[str, Any]]:
    rows = db.execute("SELECT data FROM state WHERE kind = 'transaction' ORDER BY rowid")
    return [orjson.loads(data) for (data,) in rows]


def render(rows: list[dict[str, Any]], *, as_json: bool) -> str:
    if as_json:
        return orjson.dumps(rows, option=orjson.OPT_INDENT_2).decode()
    if not rows:
        return "(none)"
    columns = list(rows[0])
    cells = [[_cell(row[c]) for c in columns] for row in rows]
    widths = [max(len(c), *(len(r[i]) for r in cells)) for i, c in enumerate(columns)]
    lines = [_line(columns, widths), _line(["-" * w for w in widths], widths)]
    lines += [_line(r, widths) for r in cells]
    return "\n".join(lines)


def _cell(value: Any) -> str:
    if isinstance(value, list):
        return ",".join(str(v) for v in value)
    return "" if value is None else str(value)


def _line(values: Sequence[str], widths: Sequence[int]) -> str:
    return "  ".join(v.ljust(w) for v, w in zip(values, widths, strict=True)).rstrip()
