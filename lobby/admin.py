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

from lobby.core.records import MessageStored
from lobby.store.sqlite import FILE_NAME, stored_messages


class StoreNotFound(Exception):
    pass


class UnknownAgent(Exception):
    pass


def open_readonly(data_dir: Path) -> sqlite3.Connection:
    path = data_dir / FILE_NAME
    if not path.exists():
        raise StoreNotFound(f"no lobby store at {path} (is --data-dir right?)")
    return sqlite3.connect(f"file:{path}?mode=ro", uri=True)


def _held(db: sqlite3.Connection) -> dict[str, list[MessageStored]]:
    """Per agent, the stored messages it has not acknowledged, oldest first."""
    acked = dict(db.execute("SELECT receiver, up_to FROM acks"))
    held: dict[str, list[MessageStored]] = {}
    for message in stored_messages(db):
        if message.seq > acked.get(message.receiver, 0):
            held.setdefault(message.receiver, []).append(message)
    return held


def agents(db: sqlite3.Connection) -> list[dict[str, Any]]:
    held = _held(db)
    rows = db.execute("SELECT agent_id, capabilities, acks FROM agents ORDER BY agent_id")
    return [
        {
            "agent_id": agent_id,
            "capabilities": [c["name"] for c in orjson.loads(capabilities)],
            "acks": bool(acks),
            "held_messages": len(held.get(agent_id, [])),
        }
        for agent_id, capabilities, acks in rows
    ]


def mailbox(db: sqlite3.Connection, agent_id: str) -> list[dict[str, Any]]:
    if db.execute("SELECT 1 FROM agents WHERE agent_id = ?", (agent_id,)).fetchone() is None:
        raise UnknownAgent(f"no agent {agent_id!r} is registered in this store (see lobby agents)")
    return [
        {
            "seq": m.seq,
            "sender_id": m.sender,
            "message_type": orjson.loads(m.frame).get("message_type"),
            "message_id": m.message_id,
            "conversation_id": m.conversation_id,
            "accepted_at": datetime.fromtimestamp(m.at, UTC).isoformat(),
        }
        for m in _held(db).get(agent_id, [])
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
