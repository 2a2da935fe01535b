"""The embedded durable store: one SQLite file (WAL) in `--data-dir`, nothing to install.

Messages are written one row per group commit, not one row per message: a batch is a single
JSON array (each message's frame embedded as it is, without re-encoding) appended to `batches`.
A SQLite row costs several microseconds to bind and insert, and a batch row costs about as
much as one of them, so durability stays a small part of a message's cost. Agents, acknowledged
watermarks, negotiation and marketplace state (`state`) and a checkpoint of open conversations
are small tables written as they change.

Crash window: with `synchronous=NORMAL` in WAL mode a committed batch survives the lobby
process being killed (the OS holds the written WAL pages); power loss or an OS crash may lose
the last few batches. `fsync=True` (`--fsync`) syncs every commit and closes that window too.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import orjson

from lobby.core.records import (
    Acked,
    AgentRemoved,
    AgentSaved,
    Compaction,
    MessageStored,
    Record,
    Snapshot,
    StateRemoved,
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
CREATE TABLE IF NOT EXISTS batches (
    id INTEGER PRIMARY KEY,
    last_row INTEGER NOT NULL,
    at REAL NOT NULL,
    receivers BLOB NOT NULL,
    messages BLOB NOT NULL
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


LOCK_NAME = "lobby.lock"
_MIN_FREE_BYTES = 1024 * 1024
"""Below this much free space, /readyz says the store cannot take writes."""


class StoreLocked(Exception):
    """Another lobby holds this data dir."""


class SqliteStore:
    """A `Store` in one SQLite file under `data_dir`, held locked against a second lobby."""

    durable = True

    def __init__(self, data_dir: Path, *, fsync: bool = False) -> None:
        data_dir.mkdir(parents=True, exist_ok=True)
        self._lock = _lock(data_dir)
        self.path = data_dir / FILE_NAME
        try:
            # One writer thread uses this connection after load(); never two threads at once.
            self._db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute(f"PRAGMA synchronous={'FULL' if fsync else 'NORMAL'}")
            self._db.executescript(_SCHEMA)
            self._inode = os.stat(self.path).st_ino
        except BaseException:
            os.close(self._lock)
            raise

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
        snapshot.messages = list(stored_messages(db))
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

    def agent(self, agent_id: str) -> AgentSaved | None:
        """One agent as saved (for `lobby revoke`/`remove` on a stopped lobby's store)."""
        row = self._db.execute(
            "SELECT token_hash, capabilities, acks FROM agents WHERE agent_id = ?", (agent_id,)
        ).fetchone()
        if row is None:
            return None
        return AgentSaved(agent_id, bytes(row[0]), bytes(row[1]), bool(row[2]))

    def write(self, records: list[Record]) -> None:
        messages: list[list[object]] = []
        receivers: dict[str, int] = {}
        acked: dict[str, int] = {}
        db = self._db
        db.execute("BEGIN")
        try:
            for record in records:
                if type(record) is MessageStored:
                    messages.append(
                        [
                            record.row_id,
                            record.receiver,
                            record.seq,
                            record.sender,
                            record.message_id,
                            record.conversation_id,
                            record.effect,
                            record.at,
                            orjson.Fragment(record.frame),
                        ]
                    )
                    receivers[record.receiver] = record.seq
                elif type(record) is Acked:
                    acked[record.receiver] = max(record.up_to, acked.get(record.receiver, 0))
                else:
                    # Agent and state changes are rare and their order matters: write the
                    # messages that came before them first.
                    self._insert_batch(messages, receivers)
                    messages, receivers = [], {}
                    self._write_other(record)
            self._insert_batch(messages, receivers)
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

    def _insert_batch(self, messages: list[list[object]], receivers: dict[str, int]) -> None:
        if messages:
            last = messages[-1]
            self._db.execute(
                "INSERT INTO batches (last_row, at, receivers, messages) VALUES (?, ?, ?, ?)",
                (last[0], last[7], orjson.dumps(receivers), orjson.dumps(messages)),
            )

    def _write_other(self, record: Record) -> None:
        if isinstance(record, StateSaved):
            self._db.execute(
                "INSERT INTO state (kind, key, data) VALUES (?, ?, ?)"
                " ON CONFLICT (kind, key) DO UPDATE SET data = excluded.data",
                (record.kind, record.key, record.data),
            )
        elif isinstance(record, StateRemoved):
            self._db.execute(
                "DELETE FROM state WHERE kind = ? AND key = ?", (record.kind, record.key)
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
            self._db.execute("DELETE FROM acks WHERE receiver = ?", (record.agent_id,))
            self._drop_messages_to(record.agent_id)

    def _drop_messages_to(self, agent_id: str) -> None:
        """Delete what was stored for a removed agent, so that an agent registered later under
        the same id does not find it at the next start. Rare (UNREGISTER, `lobby remove`):
        only the batches that name it are read and rewritten."""
        db = self._db
        # An agent id has no '%'; its '_' matches itself too: the rows are checked below.
        pattern = f"%{orjson.dumps(agent_id).decode()}%"
        for batch_id, receivers, messages in db.execute(
            "SELECT id, receivers, messages FROM batches WHERE CAST(receivers AS TEXT) LIKE ?",
            (pattern,),
        ).fetchall():
            named: dict[str, int] = orjson.loads(receivers)
            if agent_id not in named:
                continue
            del named[agent_id]
            kept = [m for m in orjson.loads(messages) if m[1] != agent_id]
            # An emptied batch is kept: its last_row still bounds the row ids given later.
            db.execute(
                "UPDATE batches SET receivers = ?, messages = ? WHERE id = ?",
                (orjson.dumps(named), orjson.dumps(kept), batch_id),
            )

    def compact(self, compaction: Compaction) -> None:
        """Checkpoint open conversations, then delete the batches no one can need again: every
        message in them acknowledged (or its receiver gone) and older than the dedupe horizon."""
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
            acked = compaction.acked
            done = [
                (batch_id,)
                for batch_id, receivers in db.execute(
                    "SELECT id, receivers FROM batches WHERE last_row <= ? AND at < ?",
                    (compaction.upto_row, compaction.forget_before),
                )
                if all(
                    receiver not in acked or acked[receiver] >= seq
                    for receiver, seq in orjson.loads(receivers).items()
                )
            ]
            db.executemany("DELETE FROM batches WHERE id = ?", done)
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise

    def unwritable(self) -> str | None:
        """The file must still be the one opened (writes to a deleted or moved file are lost
        with the process), it and its directory (where SQLite keeps the WAL) writable, and
        its file system not full."""
        try:
            inode = os.stat(self.path).st_ino
        except FileNotFoundError:
            inode = None
        if inode != self._inode:
            return f"the store {str(self.path)!r} was deleted or replaced since the lobby opened it"
        for path in (self.path, self.path.parent):
            if not os.access(path, os.W_OK):
                return f"{str(path)!r} is not writable"
        disk = os.statvfs(self.path.parent)
        if disk.f_bavail * disk.f_frsize < _MIN_FREE_BYTES:
            return f"the file system of {str(self.path.parent)!r} is full"
        return None

    def wal_bytes(self) -> int:
        """The size of the write-ahead log (compaction's checkpoints keep it in bounds)."""
        try:
            return os.stat(f"{self.path}-wal").st_size
        except FileNotFoundError:
            return 0

    def close(self) -> None:
        self._db.close()
        os.close(self._lock)  # releases the lock


def _lock(data_dir: Path) -> int:
    """Hold `data_dir/lobby.lock` (an advisory lock, released when the process ends however it
    ends) so that a second lobby on the same data dir is refused instead of writing beside the
    first; the holder's pid is in the file, for the error."""
    path = data_dir / LOCK_NAME
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.read(fd, 32).decode(errors="replace").strip() or "?"
        os.close(fd)
        raise StoreLocked(
            f"another lobby (pid {holder}) is running on data dir {str(data_dir)!r}: stop it, "
            "or give this one another --data-dir"
        ) from None
    with contextlib.suppress(OSError):
        os.ftruncate(fd, 0)
        os.write(fd, str(os.getpid()).encode())
    return fd


def stored_messages(db: sqlite3.Connection) -> Iterator[MessageStored]:
    """Every message still on disk, oldest first (also read by `lobby mailbox`)."""
    for (data,) in db.execute("SELECT messages FROM batches ORDER BY id"):
        for row_id, receiver, seq, sender, message_id, conv, effect, at, frame in orjson.loads(
            data
        ):
            yield MessageStored(
                row_id, receiver, seq, sender, message_id, conv, effect, orjson.dumps(frame), at
            )
