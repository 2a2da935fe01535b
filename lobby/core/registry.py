"""The capability registry: who is registered, what each agent offers, and discovery over it.

Plain state, no I/O. Lookups that sit on the routing path (agent by id, capability by name) are
single dict lookups; discovery uses inverted indexes kept up to date on every change, so its cost
follows the number of matches, not the number of registered capabilities.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from lobby.core.limits import TokenBucket
from lobby.core.schemas import InputCheck, input_check
from lobby.core.search import SearchIndex
from protocol.models import Capability

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
    input_check: InputCheck | None
    """`None` when the input schema accepts any object (see lobby.core.schemas)."""

    @classmethod
    def of(cls, capability: Capability) -> CapabilityEntry:
        ids = capability.authorized_requester_ids
        return cls(
            capability,
            frozenset(ids) if ids else None,
            capability.model_dump(mode="json"),
            input_check(capability),
        )


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
    """The `seq` of the last message written to one of its connections."""
    acked_seq: int = 0
    open_requests: int = 0
    """Its REQUESTs not yet answered with a final RESPONSE (bounded by `max_open_requests`)."""
    bucket: TokenBucket | None = None
    """Its message rate limit, made on first use."""


class Registry:
    """Registered agents and the indexes discovery searches."""

    def __init__(self) -> None:
        self.agents: dict[str, AgentRecord] = {}
        self._by_name: dict[str, set[str]] = {}
        self._by_keyword: dict[str, set[tuple[str, str]]] = {}
        self.search = SearchIndex()

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
        return record

    def set_capabilities(self, record: AgentRecord, capabilities: list[Capability]) -> None:
        """Replace everything `record` offers with `capabilities` (the last of a name wins)."""
        self._unindex(record)
        record.capabilities = {c.name: CapabilityEntry.of(c) for c in capabilities}
        self._index(record)

    def discover(
        self,
        *,
        requester_id: str,
        capability_name: str | None,
        keywords: list[str] | None,
    ) -> list[tuple[AgentRecord, list[CapabilityEntry]]]:
        """Agents other than the requester with the capabilities that match, by agent id.

        A capability matches when it has the given name (if any) and shares at least one
        keyword, case-insensitively, with `keywords` (if any). With neither, all match.
        """
        wanted_keywords = {k.lower() for k in keywords} if keywords else None
        matches: dict[str, list[CapabilityEntry]] = {}
        if capability_name is not None:
            for agent_id in self._by_name.get(capability_name, ()):
                entry = self.agents[agent_id].capabilities[capability_name]
                if wanted_keywords is None or wanted_keywords & _keywords(entry.model):
                    matches.setdefault(agent_id, []).append(entry)
        elif wanted_keywords is not None:
            pairs: set[tuple[str, str]] = set()
            for keyword in wanted_keywords:
                pairs |= self._by_keyword.get(keyword, set())
            for agent_id, name in pairs:
                matches.setdefault(agent_id, []).append(self.agents[agent_id].capabilities[name])
        else:
            for agent_id, record in self.agents.items():
                if record.capabilities:
                    matches[agent_id] = list(record.capabilities.values())
        matches.pop(requester_id, None)
        return [
            (self.agents[agent_id], sorted(entries, key=lambda e: e.model.name))
            for agent_id, entries in sorted(matches.items())
        ]

    def keys_matching(
        self, capability_name: str | None, keywords: list[str] | None
    ) -> set[tuple[str, str]]:
        """(agent_id, name) of the capabilities with that exact name and/or any keyword."""
        return {
            (record.agent_id, entry.model.name)
            for record, entries in self.discover(
                requester_id="", capability_name=capability_name, keywords=keywords
            )
            for entry in entries
        }

    def _index(self, record: AgentRecord) -> None:
        for name, entry in record.capabilities.items():
            model = entry.model
            self.search.add(
                record.agent_id, name, model.description, model.keywords, model.attributes or {}
            )
            self._by_name.setdefault(name, set()).add(record.agent_id)
            for keyword in _keywords(entry.model):
                self._by_keyword.setdefault(keyword, set()).add((record.agent_id, name))

    def _unindex(self, record: AgentRecord) -> None:
        for name, entry in record.capabilities.items():
            self.search.remove(record.agent_id, name)
            _discard(self._by_name, name, record.agent_id)
            for keyword in _keywords(entry.model):
                _discard(self._by_keyword, keyword, (record.agent_id, name))


def _keywords(capability: Capability) -> set[str]:
    return {k.lower() for k in capability.keywords}


def _discard(index: dict[str, set[Any]], key: str, member: object) -> None:
    members = index.get(key)
    if members is not None:
        members.discard(member)
        if not members:
            del index[key]
