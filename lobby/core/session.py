"""Sessions (one per connection), the record of the agent a session speaks for, and the actions
the router asks the I/O layer to carry out."""

from __future__ import annotations

import itertools
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from lobby.core.accepting import Unsettled
    from lobby.core.discovery.schemas import CapabilityEntry
    from lobby.core.limits import TokenBucket

_session_ids = itertools.count(1)


class _NoMail(deque[tuple[int, bytes]]):
    """The mailbox of every agent that has never had a message held: one, shared and always
    empty (an empty deque costs about 600 bytes, and most idle agents never hold a message).
    Whatever reads or empties a mailbox works on it as on any empty deque; what holds a message
    gives the agent a mailbox of its own first (`AgentRecord.hold`, or `NO_MAIL` checked
    inline on the delivery path)."""

    def append(self, item: tuple[int, bytes], /) -> None:
        raise TypeError("the shared empty mailbox holds nothing: AgentRecord.hold")

    def appendleft(self, item: tuple[int, bytes], /) -> None:
        self.append(item)

    def extend(self, items: object, /) -> None:
        raise TypeError("the shared empty mailbox holds nothing: AgentRecord.hold")

    extendleft = extend

    def insert(self, at: int, item: tuple[int, bytes], /) -> None:
        self.append(item)

    def __iadd__(self, items: object, /) -> _NoMail:
        raise TypeError("the shared empty mailbox holds nothing: AgentRecord.hold")

    # Copied or pickled, it stays the one shared mailbox (`is NO_MAIL` holds for copies).
    def __copy__(self) -> _NoMail:
        return self

    def __deepcopy__(self, memo: object) -> _NoMail:
        return self

    def __reduce__(self) -> str:  # type: ignore[override]
        return "NO_MAIL"


NO_MAIL: Final = _NoMail()


def _no_mail() -> deque[tuple[int, bytes]]:
    return NO_MAIL


class Session:
    """The router's view of one connection.

    `agent` is set once REGISTER succeeds and cleared when the connection is replaced, closed or
    unregistered. `link` belongs to the I/O layer (its connection object); the core never
    touches it.
    """

    __slots__ = ("agent", "host", "id", "link", "proven", "remote", "unsettled")

    def __init__(self, remote: str = "", link: object = None, host: str = "") -> None:
        self.id = next(_session_ids)
        self.remote = remote
        self.host = host
        """The peer's address without the port: registration attempts are counted by it."""
        self.link = link
        self.agent: AgentRecord | None = None
        self.proven: tuple[AgentRecord, str] | None = None
        """The agent and the token this connection last proved it holds (its hash matched):
        the same token again is compared as it is, not hashed per message. Kept in memory for
        the connection's life only; the store and the logs never see it."""
        self.unsettled: Unsettled | None = None
        """Cluster only: its messages since the first forwarded one still outstanding
        (`lobby.core.accepting`); None while there is none."""

    def __repr__(self) -> str:
        agent_id = self.agent.agent_id if self.agent else None
        return f"Session(id={self.id}, agent={agent_id!r}, remote={self.remote!r})"


REVOKED: Final = b""
"""The `token_hash` of an agent whose token an operator revoked: no token hashes to it."""


@dataclass(slots=True, eq=False)
class AgentRecord:
    """A registered agent, online (it has a session) or offline."""

    agent_id: str
    token_hash: bytes
    """SHA-256 of the auth token; the token itself is never kept."""
    capabilities: dict[str, CapabilityEntry] = field(default_factory=dict)
    acks: bool = False
    """The agent acknowledges deliveries (ACK) and wants ACCEPTED confirmations."""
    session: Session | None = None
    mailbox: deque[tuple[int, bytes]] = field(default_factory=_no_mail)
    """(seq, frame) held for the agent, oldest first: not yet acknowledged (acking agents) or
    not yet written to a connection (others). `NO_MAIL` until its first (`hold`)."""
    next_seq: int = 0
    """The `seq` of the last message accepted for this agent."""
    delivered_seq: int = 0
    """The `seq` of the last message written to its connection (while offline: to its last
    one); those after it in the mailbox wait to be written."""
    redeliver_upto: int = 0
    """Messages up to this `seq` reached an earlier connection: written again, they are marked
    `redelivered`."""
    paced: bool = False
    """Its connection's outbound queue passed the delivery window, or held messages wait to be
    written: what is accepted for it is held in its mailbox, and written oldest first as the
    queue drains (`Delivery.release`)."""
    held_bytes: int = 0
    """Bytes of the messages held unwritten that were accepted while it was connected (not
    the backlog it resumed to): with its queue, bounded by `--max-outbound-bytes` (4002)."""
    resumed_seq: int = 0
    """`next_seq` when its connection registered: later messages arrived while connected."""
    acked_seq: int = 0
    open_requests: int = 0
    """Its REQUESTs not yet answered with a final RESPONSE (bounded by `max_open_requests`)."""
    serving: int = 0
    """REQUESTs to it not yet answered with a final RESPONSE (open conversations it is the
    responder of): a capability-addressed REQUEST goes to the provider with the fewest."""
    bucket: TokenBucket | None = None
    """Its message rate limit, made on first use."""
    discover_bucket: TokenBucket | None = None
    """Its DISCOVER_SERVICES rate limit, made on its first query."""
    queries_waiting: int = 0
    """Its DISCOVER_SERVICES accepted and not yet answered (`Router.queries`)."""
    home: str | None = None
    """Cluster only: the node holding its connection, when that is another node (messages to
    it are forwarded there); None: this node."""

    def hold(self, seq: int, frame: bytes) -> None:
        """Keep message `seq` in its mailbox, newest last (its own mailbox from the first)."""
        mailbox = self.mailbox
        if mailbox is NO_MAIL:
            mailbox = self.mailbox = deque()
        mailbox.append((seq, frame))


@dataclass(slots=True)
class Send:
    """Write `frame` (one JSON text frame) to `session`'s connection."""

    session: Session
    frame: bytes


@dataclass(slots=True)
class Close:
    """Close `session`'s connection with a WebSocket close code and reason."""

    session: Session
    code: int
    reason: str


@dataclass(slots=True)
class Pause:
    """Read nothing more from `session`'s connection for `seconds`: an agent past its rate
    limit waits in TCP's backpressure instead of costing the lobby a refusal per frame."""

    session: Session
    seconds: float


Action = Send | Close | Pause
