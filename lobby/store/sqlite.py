"""The embedded durable store: one SQLite file (WAL) in `--data-dir`, nothing to install.

Every routed message is one appended row in `messages` (a rowid table, ids assigned by the
core, so inserts are appends and cost a few microseconds); agents, acknowledged watermarks and
a periodic checkpoint of open conversations are small tables. `write()` is one transaction per
batch (group commit), called from the server's single writer thread.

Crash window: with `synchronous=NORMAL` in WAL mode a committed batch survives the lobby
process being killed (the OS holds the written WAL pages); power loss or an OS crash may lose
the last few batches. `fsync=True` (`--fsync`) syncs every commit and closes that window too.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from pathlib import Path

from lobby.store.base import (
    Acked,
    AgentRemoved,
    AgentSaved,
    Compaction,
    MessageStored,
    Record,
    Snapshot,
    StateSaved,
)

FILE_NAME = "lobby.sqlite3"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS agents (
    agent_id TEXT PRIMARY KEY,
    token_hash BLOB NOT NULL,
    capabilities BLOB NOT NULL,
    acks INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS messages (
    id INTEGER PRIMARY KEY,
    receiver TEXT NOT NULL,
    seq INTEGER NOT NULL,
    sender TEXT NOT NULL,
    message_id TEXT NOT NULL,
    conversation_id TEXT,
    effect INTEGER NOT NULL,
    frame BLOB NOT NULL,
    at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS state (
    kind TEXT NOT NULL,
    key TEXT NOT NULL,
    data BLOB NOT NULL,
    UNIQUE (kind, key)
);
CREATE TABLE IF NOT EXISTS acks (receiver TEXT PRIMARY KEY, up_to INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS conversations (
    requester TEXT NOT NULL,
    responder TEXT NOT NULL,
    conversation_id TEXT NOT NULL,
    open_requests INTEGER NOT NULL,
    PRIMARY KEY (requester, responder, conversation_id)
) WITHOUT ROWID;
"""


class SqliteStore:
    durable = True

    def __init__(self, data_dir: Path, *, fsync: bool = False) -> None:
        data_dir.mkdir(parents=True, exist_ok=True)
        self.path = data_dir / FILE_NAME
        # One writer thread uses this connection after load(); never two threads at once.
        self._db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute(f"PRAGMA synchronous={'FULL' if fsync else 'NORMAL'}")
        self._db.executescript(_SCHEMA)

    def load(self) -> Snapshot:
        db = self._db
        snapshot = Snapshot()
        snapshot.agents = [
            AgentSaved(agent_id, bytes(token_hash), bytes(capabilities), bool(acks))
            for agent_id, token_hash, capabilities, acks in db.execute(
                "SELECT agent_id, token_hash, capabilities, acks FROM agents ORDER BY rowid"
            )
        ]
        snapshot.acked = dict(db.execute("SELECT receiver, up_to FROM acks"))
        snapshot.messages = [
            MessageStored(row_id, receiver, seq, sender, mid, conv, effect, bytes(frame), at)
            for row_id, receiver, seq, sender, mid, conv, effect, frame, at in db.execute(
                "SELECT id, receiver, seq, sender, message_id, conversation_id, effect, frame, at"
                " FROM messages ORDER BY id"
            )
        ]
        snapshot.conversations = {
            (requester, responder, conversation_id): count
            for requester, responder, conversation_id, count in db.execute(
                "SELECT requester, responder, conversation_id, open_requests FROM conversations"
            )
        }
        for kind, data in db.execute("SELECT kind, data FROM state ORDER BY rowid"):
            snapshot.state.setdefault(kind, []).append(bytes(data))
        row = db.execute("SELECT value FROM meta WHERE key = 'conversations_upto'").fetchone()
        snapshot.conversations_upto = row[0] if row else 0
        return snapshot

    def write(self, records: list[Record]) -> None:
        messages = []
        acked: dict[str, int] = {}
        db = self._db
        db.execute("BEGIN")
        try:
            for record in records:
                if type(record) is MessageStored:
                    messages.append(
                        (
                            record.row_id,
                            record.receiver,
                            record.seq,
                            record.sender,
                            record.message_id,
                            record.conversation_id,
                            record.effect,
                            record.frame,
                            record.at,
                        )
                    )
                elif type(record) is Acked:
                    acked[record.receiver] = max(record.up_to, acked.get(record.receiver, 0))
                else:
                    # Agent and state changes are rarer and their order matters: write what
                    # came before first.
                    self._insert_messages(messages)
                    messages = []
                    self._write_agent(record)
            self._insert_messages(messages)
            if acked:
                db.executemany(
                    "INSERT INTO acks (receiver, up_to) VALUES (?, ?) ON CONFLICT (receiver)"
                    " DO UPDATE SET up_to = max(up_to, excluded.up_to)",
                    acked.items(),
                )
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise

    def _insert_messages(self, rows: Sequence[tuple[object, ...]]) -> None:
        if rows:
            self._db.executemany("INSERT INTO messages VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)", rows)

    def _write_agent(self, record: Record) -> None:
        if isinstance(record, StateSaved):
            self._db.execute(
                "INSERT INTO state (kind, key, data) VALUES (?, ?, ?)"
                " ON CONFLICT (kind, key) DO UPDATE SET data = excluded.data",
                (record.kind, record.key, record.data),
            )
        elif isinstance(record, AgentSaved):
            self._db.execute(
                "INSERT INTO agents (agent_id, token_hash, capabilities, acks)"
                " VALUES (?, ?, ?, ?) ON CONFLICT (agent_id) DO UPDATE SET"
                " token_hash = excluded.token_hash, capabilities = excluded.capabilities,"
                " acks = excluded.acks",
                (record.agent_id, record.token_hash, record.capabilities, int(record.acks)),
            )
        elif isinstance(record, AgentRemoved):
            self._db.execute("DELETE FROM agents WHERE agent_id = ?", (record.agent_id,))
            self._db.execute("DELETE FROM messages WHERE receiver = ?", (record.agent_id,))
            self._db.execute("DELETE FROM acks WHERE receiver = ?", (record.agent_id,))

    def compact(self, compaction: Compaction) -> None:
        """Checkpoint open conversations, then delete what no one can need again: messages
        acknowledged by their receiver and older than the dedupe horizon."""
        db = self._db
        db.execute("BEGIN")
        try:
            db.execute("DELETE FROM conversations")
            db.executemany(
                "INSERT INTO conversations VALUES (?, ?, ?, ?)",
                [(*key, count) for key, count in compaction.conversations.items()],
            )
            db.execute(
                "INSERT OR REPLACE INTO meta (key, value) VALUES ('conversations_upto', ?)",
                (compaction.upto_row,),
            )
            db.execute(
                "DELETE FROM messages WHERE id <= ? AND at < ? AND seq <= coalesce("
                "(SELECT up_to FROM acks WHERE acks.receiver = messages.receiver), 0)",
                (compaction.upto_row, compaction.forget_before),
            )
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise

    def close(self) -> None:
        self._db.close()

    def stats(self) -> dict[str, int]:
        """Row counts, for the admin commands and tests."""
        return {
            table: self._db.execute(f"SELECT count(*) FROM {table}").fetchone()[0]  # noqa: S608
            for table in ("agents", "messages", "acks", "conversations", "state")
        }
