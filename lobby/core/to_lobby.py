"""Messages addressed to the lobby itself: ACK, FETCH_MESSAGES, LIST_TRANSACTIONS,
DISCOVER_SERVICES, UPDATE_CAPABILITIES and UNREGISTER.

Each must name the lobby (`global_lobby`) as its receiver, or it is refused (`malformed`). None
is forwarded: the lobby answers the sender directly (`reply`, not stored), changes its own state,
or both.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import orjson
import structlog

from lobby.core.discovery.discover import MAX_WAITING_QUERIES, BadDiscovery, services_available
from lobby.core.limits import TokenBucket, pause_after
from lobby.core.refusal import Refusal, require_lobby_receiver, validate
from lobby.core.registration import Registrar
from lobby.core.session import Action, AgentRecord, Close, Send, Session
from lobby.core.state import LobbyState
from protocol.codec import to_dict
from protocol.limits import MAX_SENTENCE_LENGTH, clip
from protocol.models import LOBBY_ID, CloseCode, ErrorCode, Message, MessageType
from protocol.payloads import (
    DiscoverServicesPayload,
    FetchMessagesPayload,
    UpdateCapabilitiesPayload,
)

log = structlog.get_logger("lobby")


@dataclass(slots=True, eq=False)
class WaitingQuery:
    """A DISCOVER_SERVICES accepted and not yet answered (`ToLobby.queries`)."""

    session: Session
    agent: AgentRecord
    query: DiscoverServicesPayload
    msg: Message
    message_id: str = ""
    """Its answer's message id, given when it is first taken to be answered."""
    room: int = 0
    """Bytes its answer's payload may take (`max_discover_bytes` less the envelope)."""


class ToLobby:
    """Handles the messages a registered agent addresses to the lobby; owns only the line of
    DISCOVER_SERVICES waiting for their answers (the mailbox, the registry and the ledger are
    the shared state's)."""

    def __init__(self, state: LobbyState, registrar: Registrar) -> None:
        self.state = state
        self.registrar = registrar
        self.queries: deque[WaitingQuery] = deque()
        """DISCOVER_SERVICES accepted and not yet answered, oldest first (`answer_query`)."""

    def ack(self, session: Session, agent: AgentRecord, msg: Message) -> list[Action]:
        require_lobby_receiver(msg)
        up_to = msg.payload.get("up_to")
        if type(up_to) is not int or up_to < 0:
            raise Refusal(
                ErrorCode.MALFORMED, "an ACK payload needs a non-negative integer 'up_to'"
            )
        self.state.delivery.acknowledge(agent, up_to)
        return []

    def list_transactions(self, session: Session, agent: AgentRecord, msg: Message) -> list[Action]:
        require_lobby_receiver(msg)
        payload = {"transactions": self.state.ledger.of(agent.agent_id)}
        return [self.state.reply(session, MessageType.TRANSACTIONS, payload, msg)]

    def fetch_messages(self, session: Session, agent: AgentRecord, msg: Message) -> list[Action]:
        """The mailbox pull: what is held for the agent after `since` (which acknowledges
        everything up to it). Push delivery reads the same mailbox."""
        require_lobby_receiver(msg)
        query = validate(FetchMessagesPayload, msg)
        if query.since is not None:
            self.state.delivery.acknowledge(agent, query.since)
        after = query.since or 0
        held = [(seq, frame) for seq, frame in agent.mailbox if seq > after][: query.limit]
        cursor = held[-1][0] if held else max(after, agent.acked_seq)
        payload = {"messages": [orjson.Fragment(frame) for _, frame in held], "cursor": cursor}
        return [self.state.reply(session, MessageType.MESSAGES, payload, msg)]

    def _limit_discovery(self, agent: AgentRecord) -> None:
        limits = self.state.limits
        if not limits.discover_rate:
            return
        now = self.state.clock()
        bucket = agent.discover_bucket
        if bucket is None:
            bucket = agent.discover_bucket = TokenBucket(
                limits.discover_rate, limits.discover_burst, now
            )
        if not bucket.take(now):
            raise Refusal(
                ErrorCode.RATE_LIMITED,
                f"agent {agent.agent_id!r} sends more than {limits.discover_rate:g} "
                "DISCOVER_SERVICES a second; this one was not answered",
                pause=pause_after(bucket),
            )

    def discover_services(self, session: Session, agent: AgentRecord, msg: Message) -> list[Action]:
        require_lobby_receiver(msg)
        self._limit_discovery(agent)
        query = validate(DiscoverServicesPayload, msg)
        if agent.queries_waiting >= MAX_WAITING_QUERIES:
            raise Refusal(
                ErrorCode.RATE_LIMITED,
                f"agent {agent.agent_id!r} already has {MAX_WAITING_QUERIES} "
                "DISCOVER_SERVICES waiting for their answers; this one was not answered",
            )
        # Answered later, one per pass of the event loop (`answer_query`), after the routed
        # messages that pass read: a query costs up to a few ms, a routed message microseconds.
        agent.queries_waiting += 1
        self.queries.append(WaitingQuery(session, agent, query, msg))
        return []

    def take_query(self) -> WaitingQuery | None:
        """Take the oldest DISCOVER_SERVICES waiting in `queries` to answer it (call only while
        it holds one), its answer's message id and byte room set; None when its connection
        closed meanwhile. Give the answer to `answered`."""
        waiting = self.queries.popleft()
        if waiting.session.agent is not waiting.agent:
            waiting.agent.queries_waiting -= 1
            return None
        if not waiting.message_id:
            waiting.message_id = self.state.delivery.new_message_id()
            # The payload may take what the bound leaves beside the envelope (whose own "{}"
            # is the payload's place).
            envelope = len(self._services_available(waiting, b"{}"))
            waiting.room = self.state.limits.max_discover_bytes - envelope + 2
        return waiting

    def answered(
        self, waiting: WaitingQuery, payload: bytes | None, problem: str = ""
    ) -> list[Action]:
        """Send the answer to a query from `take_query`: its SERVICES_AVAILABLE `payload` as
        JSON, or None and the `problem` that makes it an ERROR `malformed`. Nothing when its
        connection closed meanwhile."""
        session, agent = waiting.session, waiting.agent
        agent.queries_waiting -= 1
        if session.agent is not agent:
            return []
        if payload is None:
            return self.state.error(session, waiting.msg, ErrorCode.MALFORMED, problem)
        return [Send(session, self._services_available(waiting, payload))]

    def answer_query(self) -> list[Action]:
        """Answer the oldest DISCOVER_SERVICES waiting in `queries` (call only while it holds
        one), in process: SERVICES_AVAILABLE, an ERROR, or nothing when its connection closed
        meanwhile."""
        waiting = self.take_query()
        if waiting is None:
            return []
        try:
            payload = services_available(
                self.state.registry, waiting.agent.agent_id, waiting.query, room=waiting.room
            )
        except BadDiscovery as bad:
            return self.answered(waiting, None, str(bad))
        return self.answered(waiting, orjson.dumps(payload))

    def _services_available(self, waiting: WaitingQuery, payload: bytes) -> bytes:
        # The empty payload only holds its place: the answer's bytes replace it below.
        envelope = to_dict(
            Message(
                LOBBY_ID,
                waiting.agent.agent_id,
                MessageType.SERVICES_AVAILABLE,
                {},  # pragma: no mutate
                waiting.msg.conversation_id,
                message_id=waiting.message_id,
            )
        )
        envelope["payload"] = orjson.Fragment(payload)
        return orjson.dumps(envelope)

    def update_capabilities(
        self, session: Session, agent: AgentRecord, msg: Message
    ) -> list[Action]:
        require_lobby_receiver(msg)
        update = validate(UpdateCapabilitiesPayload, msg)
        self.registrar.check_capabilities(update.capabilities)
        before = agent.capabilities
        self.state.registry.set_capabilities(agent, update.capabilities)
        self.state.save(agent)
        log.info(
            "AGENT_CAPABILITIES_UPDATED",
            agent_id=agent.agent_id,
            capabilities=clip(", ".join(sorted(agent.capabilities)), MAX_SENTENCE_LENGTH),
        )
        return self.state.presence.declared(agent, before)

    def unregister(self, session: Session, agent: AgentRecord, msg: Message) -> list[Action]:
        require_lobby_receiver(msg)
        self.state.registry.remove(agent.agent_id)
        agent.session = None
        session.agent = None
        self.state.removed(agent.agent_id)
        log.info("AGENT_UNREGISTERED", agent_id=agent.agent_id, dropped=len(agent.mailbox))
        return [
            Close(session, CloseCode.UNREGISTERED, "unregistered"),
            *self.state.presence.removed(agent),
        ]
