"""Presence: the watches agents hold (WATCH, UNWATCH) and the PRESENCE each change causes.

A watch belongs to the connection that made it and is named by its `conversation_id`. It is
indexed by what it watches, a capability name (`by_capability`) or agent ids (`by_agent`), so
a change of one agent costs a dict lookup per name it offers (or offered) and one for its id,
and nothing more while nobody watches. What a watcher learns of an agent is what
DISCOVER_SERVICES shows it: the snapshot of a capability watch is read through the same lookup
(`SearchIndex.lookup`, which never lists the watcher itself), and every frame lists the agent's
capabilities unless the agent is the watcher.

PRESENCE frames are sent straight to the watcher's connection (`Send`): state, not messages,
so never stored, replayed or numbered. A slow watcher's queue is the I/O layer's to bound
(4002), never the changing agent's concern.

On a cluster node (`sharing`), the agents homed here that come online or go offline are queued
in `outgoing` for the other nodes (`lobby.cluster.presence`); what they report comes in as
`heard`, kept in `elsewhere` (agent -> the node it is connected to), and registration changes
other nodes made come in as `learned` / `forgot`. So a watcher on any node hears of every
node's agents.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Final

from lobby.core.counters import Counters
from lobby.core.discovery.registry import Registry
from lobby.core.discovery.schemas import CapabilityEntry
from lobby.core.refusal import Refusal, require_lobby_receiver, validate
from lobby.core.session import Action, AgentRecord, Send, Session
from protocol.codec import encode
from protocol.limits import clip
from protocol.models import LOBBY_ID, ErrorCode, Message, MessageType
from protocol.presence import MAX_WATCHES, PresenceEvent, UnwatchPayload, WatchPayload

_PAGE: Final = 1000
"""Capabilities read per lookup while a capability watch's snapshot is made."""


@dataclass(slots=True, eq=False)
class Watch:
    """One WATCH of one connection: a capability name or a set of agent ids."""

    session: Session
    watcher_id: str
    conversation_id: str
    capability_name: str | None
    agent_ids: frozenset[str]
    """Empty for a capability watch."""


class Presence:
    """Owns the watches of every connection and their indexes; turns registration changes
    into PRESENCE frames. Call `came_online`, `went_offline`, `declared` (new capabilities)
    and `removed` where the registry changes, `dropped` when a connection ends; `watch` and
    `unwatch` are the handlers of WATCH and UNWATCH."""

    def __init__(
        self, registry: Registry, new_message_id: Callable[[], str], counters: Counters
    ) -> None:
        self.registry = registry
        self.new_message_id = new_message_id
        self.counters = counters
        self.by_capability: dict[str, dict[Watch, None]] = {}
        """Capability name -> the watches of it (a dict as an ordered set)."""
        self.by_agent: dict[str, dict[Watch, None]] = {}
        """Agent id -> the watches naming it."""
        self.of_session: dict[Session, dict[str, Watch]] = {}
        """Connection -> its watches by conversation_id (at most `MAX_WATCHES`)."""
        self.sharing = False
        """Cluster only: this node tells the others of its agents (`outgoing`)."""
        self.outgoing: list[tuple[str, bool]] = []
        """Cluster only: (agent id, online) of agents homed here, in order, for the others."""
        self.elsewhere: dict[str, str] = {}
        """Cluster only: agents online on another node -> that node."""

    # -- WATCH and UNWATCH ------------------------------------------------------------------

    def watch(self, session: Session, agent: AgentRecord, msg: Message) -> list[Action]:
        """WATCH: index the watch (replacing one of the same conversation_id) and answer with
        the snapshot: one PRESENCE per matching registered agent, then `snapshot_end`."""
        require_lobby_receiver(msg)
        conversation_id = msg.conversation_id
        if conversation_id is None:
            raise Refusal(ErrorCode.MALFORMED, "WATCH needs a conversation_id: it names the watch")
        query = validate(WatchPayload, msg)
        held = self.of_session.get(session)
        old = held.get(conversation_id) if held is not None else None
        if old is None and held is not None and len(held) >= MAX_WATCHES:
            raise Refusal(
                ErrorCode.LIMIT_EXCEEDED,
                f"agent {agent.agent_id!r} already holds {MAX_WATCHES} watches; UNWATCH one "
                f"first (or reuse its conversation_id to replace it)",
            )
        if old is not None:
            self._forget(old)
        watch = Watch(
            session,
            agent.agent_id,
            conversation_id,
            query.capability_name,
            frozenset(query.agent_ids or ()),
        )
        self.of_session.setdefault(session, {})[conversation_id] = watch
        if watch.capability_name is not None:
            self.by_capability.setdefault(watch.capability_name, {})[watch] = None
        for agent_id in watch.agent_ids:
            self.by_agent.setdefault(agent_id, {})[watch] = None
        return self._snapshot(watch, msg.message_id)

    def unwatch(self, session: Session, agent: AgentRecord, msg: Message) -> list[Action]:
        """UNWATCH: the watch its conversation_id names ends; no answer."""
        require_lobby_receiver(msg)
        if msg.conversation_id is None:
            raise Refusal(ErrorCode.MALFORMED, "UNWATCH needs a conversation_id: the watch it ends")
        validate(UnwatchPayload, msg)
        held = self.of_session.get(session)
        watch = held.get(msg.conversation_id) if held is not None else None
        if watch is None:
            raise Refusal(
                ErrorCode.UNKNOWN_CONVERSATION,
                f"no watch {clip(str(msg.conversation_id))!r} on this connection",
            )
        self._forget(watch)
        return []

    def dropped(self, session: Session) -> None:
        """`session`'s connection is gone: its watches end with it."""
        held = self.of_session.get(session)
        if held is not None:
            for watch in list(held.values()):
                self._forget(watch)

    def _forget(self, watch: Watch) -> None:
        held = self.of_session[watch.session]
        del held[watch.conversation_id]
        if not held:
            del self.of_session[watch.session]
        if watch.capability_name is not None:
            _discard(self.by_capability, watch.capability_name, watch)
        for agent_id in watch.agent_ids:
            _discard(self.by_agent, agent_id, watch)

    def _snapshot(self, watch: Watch, in_reply_to: str | None) -> list[Action]:
        agents = self.registry.agents
        if watch.capability_name is None:
            found = [agents[a] for a in sorted(watch.agent_ids) if a in agents]
        else:
            found = [agents[a] for a in self._offering(watch.capability_name, watch.watcher_id)]
        actions: list[Action] = [
            Send(watch.session, self._frame(watch, record, PresenceEvent.SNAPSHOT, in_reply_to))
            for record in found
            if record.agent_id != watch.watcher_id
        ]
        end = {"event": PresenceEvent.SNAPSHOT_END, "count": len(actions)}
        actions.append(Send(watch.session, self._encode(watch, end, in_reply_to)))
        return actions

    def _offering(self, capability_name: str, watcher_id: str) -> list[str]:
        """The agents offering `capability_name` as DISCOVER_SERVICES lists them for
        `watcher_id`, in agent id order."""
        found: list[str] = []
        after = None
        while True:
            page = self.registry.search.lookup(
                capability_name=capability_name,
                keywords=None,
                exclude_agent=watcher_id,
                after=after,
                limit=_PAGE,
            )
            found.extend(hit.agent_id for hit in page.hits)
            if page.next is None:
                return found
            after = page.next.key

    # -- changes ------------------------------------------------------------------------------

    def came_online(
        self, record: AgentRecord, before: dict[str, CapabilityEntry] | None = None
    ) -> list[Action]:
        """`record` registered, or resumed while it had no connection (`before`: what it
        offered until then, when the resume declared capabilities anew)."""
        if self.sharing:
            self.outgoing.append((record.agent_id, True))
            if self.elsewhere.pop(record.agent_id, None) is not None:
                # Online on another node until now: it moved here, it did not come.
                return self.declared(record, before or {})
        return self._changed(record, PresenceEvent.ONLINE, before or {})

    def went_offline(self, record: AgentRecord) -> list[Action]:
        """`record`'s connection closed; call once its `session` is None."""
        if self.sharing:
            self.outgoing.append((record.agent_id, False))
        return self._changed(record, PresenceEvent.OFFLINE, {})

    def declared(self, record: AgentRecord, before: dict[str, CapabilityEntry]) -> list[Action]:
        """`record`, online, declared its capabilities anew (UPDATE_CAPABILITIES, a resume of
        a connected agent); `before` is what it offered. Nothing if nothing changed."""
        if not self._watched(record, before) or _same(before, record.capabilities):
            return []
        return self._changed(record, PresenceEvent.CAPABILITIES_CHANGED, before)

    def removed(self, record: AgentRecord) -> list[Action]:
        """`record` is gone from the registry (UNREGISTER, `lobby remove`)."""
        return self._changed(record, PresenceEvent.REMOVED, {})

    # -- what other nodes report (cluster only) ------------------------------------------------

    def heard(self, node: str, changes: Iterable[tuple[str, bool]]) -> list[Action]:
        """Node `node` reports its agents coming online / going offline, in order."""
        actions: list[Action] = []
        agents, elsewhere = self.registry.agents, self.elsewhere
        for agent_id, online in changes:
            was = self._online_id(agent_id)
            if online:
                elsewhere[agent_id] = node
            elif elsewhere.get(agent_id) == node:
                del elsewhere[agent_id]
            record = agents.get(agent_id)
            if record is not None and was != self._online_id(agent_id):
                event = PresenceEvent.ONLINE if online else PresenceEvent.OFFLINE
                actions += self._changed(record, event, {})
            # A record not known yet: its registration (`learned`) tells the watchers.
        return actions

    def learned(
        self, record: AgentRecord, before: dict[str, CapabilityEntry] | None, home: str | None
    ) -> list[Action]:
        """Another node registered `record` (`before` None) or changed its registration;
        `home`: where it is connected now, when it just moved there from this node."""
        if home is not None:
            self.elsewhere[record.agent_id] = home  # still online: only on another node
        if before is None:
            if record.agent_id in self.elsewhere:
                return self._changed(record, PresenceEvent.ONLINE, {})
            return []
        return self.declared(record, before)

    def forgot(self, record: AgentRecord) -> list[Action]:
        """Another node removed `record` (UNREGISTER, `lobby remove`)."""
        self.elsewhere.pop(record.agent_id, None)
        return self.removed(record)

    def _online_id(self, agent_id: str) -> bool:
        record = self.registry.agents.get(agent_id)
        return agent_id in self.elsewhere or (record is not None and record.session is not None)

    def _watched(self, record: AgentRecord, before: dict[str, CapabilityEntry]) -> bool:
        if record.agent_id in self.by_agent:
            return True
        by_capability = self.by_capability
        return bool(by_capability) and any(
            name in by_capability for name in (*record.capabilities, *before)
        )

    def _changed(
        self, record: AgentRecord, event: PresenceEvent, before: dict[str, CapabilityEntry]
    ) -> list[Action]:
        watches = self.by_agent.get(record.agent_id)
        by_capability = self.by_capability
        if watches is None and not by_capability:
            return []  # nobody watches anything: the cost of a registration is this lookup
        told: dict[Watch, None] = dict(watches) if watches is not None else {}
        if by_capability:
            for name in _names(record.capabilities, before):
                named = by_capability.get(name)
                if named is not None:
                    told.update(named)
        actions: list[Action] = []
        for watch in told:
            if watch.watcher_id == record.agent_id or watch.session.agent is None:
                continue  # never about itself (DISCOVER never lists it); a closing watcher
            actions.append(Send(watch.session, self._frame(watch, record, event, None)))
        return actions

    # -- frames -------------------------------------------------------------------------------

    def _frame(
        self,
        watch: Watch,
        record: AgentRecord,
        event: PresenceEvent,
        in_reply_to: str | None,
    ) -> bytes:
        gone = event is PresenceEvent.REMOVED
        payload = {
            "agent_id": record.agent_id,
            "event": event,
            "online": not gone
            and (record.session is not None or record.agent_id in self.elsewhere),
            "capabilities": [] if gone else sorted(record.capabilities),
        }
        return self._encode(watch, payload, in_reply_to)

    def _encode(self, watch: Watch, payload: dict[str, Any], in_reply_to: str | None) -> bytes:
        self.counters.routed[MessageType.PRESENCE] += 1
        return encode(
            Message(
                LOBBY_ID,
                watch.watcher_id,
                MessageType.PRESENCE,
                payload,
                watch.conversation_id,
                message_id=self.new_message_id(),
                in_reply_to=in_reply_to,
            )
        )


def _names(now: Iterable[str], before: Iterable[str]) -> Iterable[str]:
    """The capability names an agent offers or offered, each once."""
    return dict.fromkeys((*now, *before))


def _same(before: dict[str, CapabilityEntry], after: dict[str, CapabilityEntry]) -> bool:
    return before.keys() == after.keys() and all(
        entry.wire == after[name].wire for name, entry in before.items()
    )


def _discard(index: dict[str, dict[Watch, None]], key: str, watch: Watch) -> None:
    watches = index.get(key)
    if watches is not None:
        watches.pop(watch, None)
        if not watches:
            del index[key]


__all__ = ["Presence", "Watch"]
