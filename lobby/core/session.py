"""Sessions (one per connection) and the actions the router asks the I/O layer to carry out."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from lobby.core.discovery.registry import AgentRecord

_session_ids = itertools.count(1)


class Session:
    """The router's view of one connection.

    `agent` is set once REGISTER succeeds and cleared when the connection is replaced, closed or
    unregistered. `link` belongs to the I/O layer (its connection object); the core never
    touches it.
    """

    __slots__ = ("agent", "host", "id", "link", "proven", "remote")

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

    def __repr__(self) -> str:
        agent_id = self.agent.agent_id if self.agent else None
        return f"Session(id={self.id}, agent={agent_id!r}, remote={self.remote!r})"


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
