"""The journal's wire form for the JetStream store, and the state it folds into.

One JetStream message is one group commit: an orjson array of records, each a short array
whose first item says its kind. A message's frame (and an agent's capabilities, a saved
document) is already JSON and is embedded as it is (`orjson.Fragment`), never re-encoded.

`Folded` is what the journal amounts to: the agents, watermarks, stored messages and saved
state a `Snapshot` needs. The store keeps one up to date as it writes (so a compaction costs
the live state, not a re-read of the journal) and rebuilds one at start from the latest
snapshot plus the journal after it.
"""

from __future__ import annotations

from typing import Any

import orjson

from lobby.core.records import (
    DELIVERED,
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

AGENT_SAVED, AGENT_REMOVED, MESSAGE_STORED, ACKED, STATE_SAVED, STATE_REMOVED = range(6)


class JournalCorrupt(Exception):
    """A journal message or a snapshot is not what this module writes."""


def encode_record(record: Record) -> list[Any]:
    """One record as the array it is journaled as (the kind first)."""
    if isinstance(record, MessageStored):
        return [
            MESSAGE_STORED,
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
    if isinstance(record, Acked):
        return [ACKED, record.receiver, record.up_to]
    if isinstance(record, AgentSaved):
        return [
            AGENT_SAVED,
            record.agent_id,
            record.token_hash.hex(),
            orjson.Fragment(record.capabilities),
            record.acks,
        ]
    if isinstance(record, AgentRemoved):
        return [AGENT_REMOVED, record.agent_id]
    if isinstance(record, StateSaved):
        return [STATE_SAVED, record.kind, record.key, orjson.Fragment(record.data)]
    return [STATE_REMOVED, record.kind, record.key]


def decode_record(item: list[Any]) -> Record:
    """The record `encode_record` made `item` from (after `orjson.loads`)."""
    try:
        kind = item[0]
        if kind == MESSAGE_STORED:
            row_id, receiver, seq, sender, message_id, conv, effect, at, frame = item[1:]
            return MessageStored(
                row_id, receiver, seq, sender, message_id, conv, effect, orjson.dumps(frame), at
            )
        if kind == ACKED:
            return Acked(item[1], item[2])
        if kind == AGENT_SAVED:
            return AgentSaved(item[1], bytes.fromhex(item[2]), orjson.dumps(item[3]), item[4])
        if kind == AGENT_REMOVED:
            return AgentRemoved(item[1])
        if kind == STATE_SAVED:
            return StateSaved(item[1], item[2], orjson.dumps(item[3]))
        if kind == STATE_REMOVED:
            return StateRemoved(item[1], item[2])
    except (TypeError, ValueError, IndexError) as exc:
        raise JournalCorrupt(f"a journal record that cannot be read: {exc}") from None
    raise JournalCorrupt(f"a journal record of unknown kind {kind!r}")


def encode_records(records: list[Record], limit: int) -> list[bytes]:
    """`records` as journal messages of at most `limit` bytes each: one message unless a
    commit is larger than NATS's max_payload. Raises ValueError for a single record that does
    not fit."""
    items = [orjson.dumps(encode_record(record)) for record in records]
    messages: list[bytes] = []
    chunk: list[bytes] = []
    size = 2
    for item in items:
        if len(item) + 3 > limit:
            raise ValueError(f"a record of {len(item)} bytes exceeds NATS's max_payload {limit}")
        if chunk and size + len(item) + 1 > limit:
            messages.append(b"[" + b",".join(chunk) + b"]")
            chunk, size = [], 2
        chunk.append(item)
        size += len(item) + 1
    if chunk or not messages:
        messages.append(b"[" + b",".join(chunk) + b"]")
    return messages


def decode_records(data: bytes) -> list[Record]:
    try:
        items = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise JournalCorrupt(f"a journal message that is not JSON: {exc}") from None
    if not isinstance(items, list):
        raise JournalCorrupt("a journal message that is not an array of records")
    return [decode_record(item) for item in items]


class Folded:
    """The durable state the journal adds up to, kept as it is written. Records apply in
    journal order; applying a journal message twice (replayed over a snapshot that already
    holds it) changes nothing."""

    def __init__(self) -> None:
        self.agents: dict[str, AgentSaved] = {}
        self.acked: dict[str, int] = {}
        self.messages: list[MessageStored] = []
        self.last_row = 0
        self.state: dict[str, dict[str, bytes]] = {}
        self.conversations: dict[tuple[str, str, str], int] = {}
        self.conversations_upto = 0

    def apply(self, records: list[Record]) -> None:
        """Call with each commit's records, in the order they were written."""
        for record in records:
            if type(record) is MessageStored:
                if record.row_id > self.last_row:  # else already applied
                    self.messages.append(record)
                    self.last_row = record.row_id
            elif type(record) is Acked:
                self.acked[record.receiver] = max(record.up_to, self.acked.get(record.receiver, 0))
            elif isinstance(record, AgentSaved):
                self.agents[record.agent_id] = record
            elif isinstance(record, AgentRemoved):
                self.agents.pop(record.agent_id, None)
                self.acked.pop(record.agent_id, None)
                self.messages = [m for m in self.messages if m.receiver != record.agent_id]
            elif isinstance(record, StateSaved):
                self.state.setdefault(record.kind, {})[record.key] = record.data
            elif isinstance(record, StateRemoved):
                self.state.get(record.kind, {}).pop(record.key, None)

    def compact(self, compaction: Compaction, keep_done: int) -> None:
        """Forget what `compaction` says no one needs again (as the sqlite store does, per
        message): acknowledged (or its receiver gone), at or below its checkpoint row, and
        older than the dedupe horizon or not among the newest `keep_done` such messages (the
        core remembers no more message ids than that: `dedupe_max`). An acknowledged message
        kept for dedupe keeps no bytes: a restore reads its seq and ids, never its frame."""
        acked = compaction.acked
        kept: list[MessageStored] = []
        done_kept = 0
        for m in reversed(self.messages):
            done = m.receiver not in acked or acked[m.receiver] >= m.seq
            if done and m.row_id <= compaction.upto_row:
                if m.at < compaction.forget_before or done_kept >= keep_done:
                    continue
                done_kept += 1
            if done and m.frame != DELIVERED:
                m = MessageStored(
                    m.row_id,
                    m.receiver,
                    m.seq,
                    m.sender,
                    m.message_id,
                    m.conversation_id,
                    m.effect,
                    DELIVERED,
                    m.at,
                )
            kept.append(m)
        kept.reverse()
        self.messages = kept
        self.conversations = dict(compaction.conversations)
        self.conversations_upto = compaction.upto_row

    def snapshot(self) -> Snapshot:
        """What `Router.restore()` rebuilds the lobby from."""
        return Snapshot(
            agents=list(self.agents.values()),
            acked=dict(self.acked),
            messages=list(self.messages),
            conversations=dict(self.conversations),
            conversations_upto=self.conversations_upto,
            state={kind: list(saved.values()) for kind, saved in self.state.items()},
        )

    def encode(self) -> bytes:
        """The whole state as one document (a snapshot object), read back by `decode`."""
        records: list[Record] = [*self.agents.values(), *self.messages]
        records += [Acked(receiver, up_to) for receiver, up_to in self.acked.items()]
        for kind, saved in self.state.items():
            records += [StateSaved(kind, key, data) for key, data in saved.items()]
        return orjson.dumps(
            {
                "records": [encode_record(record) for record in records],
                "last_row": self.last_row,
                "conversations": [[*key, count] for key, count in self.conversations.items()],
                "conversations_upto": self.conversations_upto,
            }
        )

    @classmethod
    def decode(cls, data: bytes) -> Folded:
        try:
            document = orjson.loads(data)
            folded = cls()
            folded.apply([decode_record(item) for item in document["records"]])
            folded.last_row = max(folded.last_row, int(document["last_row"]))
            folded.conversations = {
                (requester, responder, cid): count
                for requester, responder, cid, count in document["conversations"]
            }
            folded.conversations_upto = int(document["conversations_upto"])
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            raise JournalCorrupt(f"a snapshot that cannot be read: {exc}") from None
        return folded
