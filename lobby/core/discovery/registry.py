"""The capability registry: who is registered, what each agent offers, and discovery over it.

Plain state, no I/O. Lookups that sit on the routing path (agent by id, capability by name) are
single dict lookups; discovery reads the search index (`search.py`, `listing.py`), kept up to
date on every change, so an answer costs about its own size, not the registry's.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

import orjson

from lobby.core.discovery.schemas import InputCheck, input_check
from lobby.core.discovery.search import SearchIndex
from lobby.core.limits import TokenBucket
from protocol.payloads import Capability

if TYPE_CHECKING:
    from lobby.core.session import Session


@dataclass(slots=True)
class CapabilityEntry:
    """A capability as the router uses it: the model, who may call it, its wire form and its
    compiled input schema."""

    model: Capability
    allowed: frozenset[str] | None
    """`None` when public (`authorized_requester_ids` null or empty)."""
    wire: dict[str, Any]
    size: int
    """Bytes of `wire` as JSON: what it adds to a DISCOVER answer, which is bounded."""
    input_check: InputCheck | None
    """`None` when the input schema accepts any object (see lobby.core.discovery.schemas)."""

    @classmethod
    def of(cls, capability: Capability) -> CapabilityEntry:
        ids = capability.authorized_requester_ids
        # What DISCOVER shows: a field left unset is left out, never a null list or map.
        wire = capability.model_dump(mode="json", exclude_none=True)
        return cls(
            capability,
            frozenset(ids) if ids else None,
            wire,
            len(orjson.dumps(wire)),
            input_check(capability),
        )


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
    mailbox: deque[tuple[int, bytes]] = field(default_factory=deque)
    """(seq, frame) held for the agent, oldest first: not yet acknowledged (acking agents) or
    not yet written to a connection (others)."""
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
    bucket: TokenBucket | None = None
    """Its message rate limit, made on first use."""
    discover_bucket: TokenBucket | None = None
    """Its DISCOVER_SERVICES rate limit, made on its first query."""
    queries_waiting: int = 0
    """Its DISCOVER_SERVICES accepted and not yet answered (`Router.queries`)."""
    home: str | None = None
    """Cluster only: the node holding its connection, when that is another node (messages to
    it are forwarded there); None: this node."""


Change = tuple[str, str] | tuple[str, str, list[dict[str, Any]]]
"""A change to the search index, as a replica applies it (`lobby.discovery_worker`):
`("offer", agent_id, [capability wire dicts])` (the agent, added or replaced with these
capabilities) or `("remove", agent_id)`."""


def _offered(record: AgentRecord) -> Change:
    return ("offer", record.agent_id, [entry.wire for entry in record.capabilities.values()])


class Registry:
    """Registered agents and the indexes discovery searches."""

    def __init__(self) -> None:
        self.agents: dict[str, AgentRecord] = {}
        self.search = SearchIndex()
        self.replicating = False
        self.changes: list[Change] = []
        """While `replicating`: what changed the search index since a replica last took them,
        oldest first (`snapshot` gives the whole index as changes). Emptied in place."""

    def __len__(self) -> int:
        return len(self.agents)

    def get(self, agent_id: str) -> AgentRecord | None:
        return self.agents.get(agent_id)

    def add(self, record: AgentRecord) -> None:
        self.agents[record.agent_id] = record
        self._index(record)

    def remove(self, agent_id: str) -> AgentRecord | None:
        record = self.agents.pop(agent_id, None)
        if record is not None:
            self._unindex(record)
            if self.replicating:
                self.changes.append(("remove", agent_id))
        return record

    def snapshot(self) -> list[Change]:
        """Every agent and its capabilities as changes: what a new replica starts from."""
        return [_offered(record) for record in self.agents.values()]

    def set_capabilities(self, record: AgentRecord, capabilities: list[Capability]) -> None:
        """Replace everything `record` offers with `capabilities` (the last of a name wins)."""
        self._unindex(record)
        record.capabilities = {c.name: CapabilityEntry.of(c) for c in capabilities}
        self._index(record)

    def offer(self, agent_id: str, capabilities: dict[str, CapabilityEntry]) -> None:
        """Apply an `("offer", ...)` change to a replica: add the agent with `capabilities`,
        or replace what it offers."""
        record = self.agents.get(agent_id)
        if record is None:
            self.add(AgentRecord(agent_id, REVOKED, capabilities))
            return
        self._unindex(record)
        record.capabilities = capabilities
        self._index(record)

    def _index(self, record: AgentRecord) -> None:
        if self.replicating:
            self.changes.append(_offered(record))
        for name, entry in record.capabilities.items():
            model = entry.model
            self.search.add(
                record.agent_id, name, model.description, model.keywords, model.attributes or {}
            )

    def _unindex(self, record: AgentRecord) -> None:
        for name in record.capabilities:
            self.search.remove(record.agent_id, name)
