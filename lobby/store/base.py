"""The `Store` interface: what the lobby persists, and what it is rebuilt from at start.

The core never touches a store. It appends records to `Router.journal` as its state changes;
the server hands each batch of records to `Store.write()` (a group commit, in a writer thread)
and, once it returns, tells senders their messages are accepted. At start, `Store.load()`
returns a `Snapshot` and `Router.restore()` rebuilds the state from it.

Hot lookups (dedupe window, per-receiver order, acknowledged watermarks) live in the core's
memory; the store only appends rows and answers `load()`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final, Protocol


@dataclass(slots=True)
class AgentSaved:
    """An agent registered, resumed with new capabilities, or updated them."""

    agent_id: str
    token_hash: bytes
    capabilities: bytes
    """JSON array of Capability objects."""
    acks: bool


@dataclass(slots=True)
class AgentRemoved:
    agent_id: str


class Effect:
    """What a stored message does to conversations, replayed at load."""

    NONE = 0
    OPENS = 1
    """A REQUEST: opens (sender, receiver, conversation_id)."""
    CLOSES = 2
    """A final RESPONSE: closes (receiver, sender, conversation_id)."""


DELIVERED: Final = b"null"
"""The `frame` of a message written at once to an agent that does not acknowledge: delivered
then and never read again, so its record keeps what it did (seq, conversation effect, dedupe
key) but not its bytes."""


@dataclass(slots=True)
class MessageStored:
    """A message accepted for `receiver`, with its per-receiver `seq`. `frame` is exactly what
    is delivered (no token), or `DELIVERED`."""

    row_id: int
    receiver: str
    seq: int
    sender: str
    message_id: str
    conversation_id: str | None
    effect: int
    frame: bytes
    at: float


@dataclass(slots=True)
class Acked:
    """`receiver` acknowledged every message up to `up_to`."""

    receiver: str
    up_to: int


@dataclass(slots=True)
class StateSaved:
    """A piece of negotiation or marketplace state, saved whole (JSON) under (kind, key):
    a dialogue after each move, an order proposal when made or paid, a ledger transaction."""

    kind: str
    key: str
    data: bytes


@dataclass(slots=True)
class StateRemoved:
    """The piece of state saved under (kind, key) is no longer needed."""

    kind: str
    key: str


Record = AgentSaved | AgentRemoved | MessageStored | Acked | StateSaved | StateRemoved


@dataclass(slots=True)
class Snapshot:
    """Everything `Router.restore()` needs, in the order it was written."""

    agents: list[AgentSaved] = field(default_factory=list)
    acked: dict[str, int] = field(default_factory=dict)
    messages: list[MessageStored] = field(default_factory=list)
    """Every stored message still on disk (unacknowledged, or within the dedupe horizon),
    oldest first."""
    conversations: dict[tuple[str, str, str], int] = field(default_factory=dict)
    """Open conversations as of `conversations_upto`; later messages are replayed on top."""
    conversations_upto: int = 0
    state: dict[str, list[bytes]] = field(default_factory=dict)
    """kind -> saved JSON documents, in the order they were first saved."""


@dataclass(slots=True)
class Compaction:
    """A checkpoint the store may use to forget what is no longer needed."""

    conversations: dict[tuple[str, str, str], int]
    upto_row: int
    acked: dict[str, int]
    forget_before: float
    """Acknowledged messages older than this (the dedupe horizon) may be deleted."""


class Store(Protocol):
    """Persistence behind the lobby. `write` and `compact` run in one writer thread, one call
    at a time; `load` runs once, before serving."""

    durable: bool

    def load(self) -> Snapshot: ...

    def write(self, records: list[Record]) -> None:
        """Persist `records` atomically (one transaction); return once they are durable."""
        ...

    def compact(self, compaction: Compaction) -> None: ...

    def unwritable(self) -> str | None:
        """Why the store cannot take a write now, or None when it can: a cheap check (no
        write), for /readyz."""
        ...

    def close(self) -> None: ...
