"""What the core records as its state changes, and what it is rebuilt from.

The core appends these records to its journal; the I/O layer takes them (`Router.take_journal`)
and hands them to a `Store` (lobby/store/), which persists them and at start returns a
`Snapshot` for `Router.restore`. The types live here, in the core, so the core needs no store
to run: the store imports them, never the reverse.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from lobby.core.session import Session

DEFAULT_DEDUPE_MAX: Final = 500_000
"""Most message ids remembered for dedupe: the core's window, and what a journal keeps of it."""


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
    """An agent unregistered: its registration and what was held for it are forgotten."""

    agent_id: str


class Effect:
    """What a stored message does to conversations, replayed at load."""

    NONE = 0
    OPENS = 1
    """A REQUEST: opens (sender, receiver, conversation_id)."""
    CLOSES = 2
    """A final RESPONSE: closes (receiver, sender, conversation_id)."""
    ENDS = 3
    """A final RESPONSE the lobby made (`timeout`, `cancelled`; sender `global_lobby`): closes
    the REQUEST its frame's `in_reply_to` names, sent by its receiver. Its frame is always
    kept (`lobby.core.deadlines`)."""


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


@dataclass(slots=True)
class Batch:
    """One group commit: the `records` to persist, and per acknowledging sender the last
    message_id it is to be told is accepted once they are durable (`Router.committed`)."""

    records: list[Record]
    accepted: dict[Session, str]
    traces: dict[Session, str | None] = field(default_factory=dict)
    """The traceparent of each sender's last accepted message, if any sent in this batch had
    one: its ACCEPTED joins that trace."""
