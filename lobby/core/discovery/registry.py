"""The capability registry: who is registered, what each agent offers, and discovery over it.

Plain state, no I/O. Lookups that sit on the routing path (agent by id, capability by name) are
single dict lookups; discovery reads the search index (`search.py`, `listing.py`), kept up to
date on every change, so an answer costs about its own size, not the registry's.
"""

from __future__ import annotations

from typing import Any

from lobby.core.discovery.schemas import CapabilityEntry
from lobby.core.discovery.search import SearchIndex
from lobby.core.session import REVOKED, AgentRecord
from protocol.payloads import Capability

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
        self.providers: dict[str, dict[str, AgentRecord]] = {}
        """Capability name -> the agents offering it, in the order they (last) declared it:
        the candidates of a capability-addressed REQUEST (`lobby.core.addressed`)."""

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
            self.providers.setdefault(name, {})[record.agent_id] = record
            model = entry.model
            self.search.add(
                record.agent_id, name, model.description, model.keywords, model.attributes or {}
            )

    def _unindex(self, record: AgentRecord) -> None:
        for name in record.capabilities:
            self.search.remove(record.agent_id, name)
            offering = self.providers.get(name)
            if offering is not None:
                offering.pop(record.agent_id, None)
                if not offering:
                    del self.providers[name]
