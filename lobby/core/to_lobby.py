"""Messages addressed to the lobby itself: ACK, FETCH_MESSAGES, LIST_TRANSACTIONS,
DISCOVER_SERVICES, UPDATE_CAPABILITIES and UNREGISTER.

Each must name the lobby (`global_lobby`) as its receiver, or it is refused (`malformed`). None
is forwarded: the lobby answers the sender directly (`reply`, not stored), changes its own state,
or both.
"""

from __future__ import annotations

from collections import deque
from typing import Any

import orjson
import structlog

from lobby.core.discovery import MAX_WAITING_QUERIES, BadDiscovery, services_available
from lobby.core.limits import TokenBucket
from lobby.core.refusal import Refusal, require_lobby_receiver, validate
from lobby.core.registration import Registrar
from lobby.core.registry import AgentRecord
from lobby.core.session import Action, Close, Send, Session
from lobby.core.state import LobbyState
from protocol.codec import encode
from protocol.limits import MAX_SENTENCE_LENGTH, clip
from protocol.models import (
    LOBBY_ID,
    CloseCode,
    DiscoverServicesPayload,
    ErrorCode,
    FetchMessagesPayload,
    Message,
    MessageType,
    UpdateCapabilitiesPayload,
)

log = structlog.get_logger("lobby")


class ToLobby:
    """Handles the messages a registered agent addresses to the lobby; owns only the line of
    DISCOVER_SERVICES waiting for their answers (the mailbox, the registry and the ledger are
    the shared state's)."""

    def __init__(self, state: LobbyState, registrar: Registrar) -> None:
        self.state = state
        self.registrar = registrar
        self.queries: deque[tuple[Session, AgentRecord, DiscoverServicesPayload, Message]]
        self.queries = deque()
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
        self.queries.append((session, agent, query, msg))
        return []

    def answer_query(self) -> list[Action]:
        """Answer the oldest DISCOVER_SERVICES waiting in `queries` (call only while it holds
        one): SERVICES_AVAILABLE, an ERROR, or nothing when its connection closed meanwhile."""
        session, agent, query, msg = self.queries.popleft()
        agent.queries_waiting -= 1
        if session.agent is not agent:
            return []
        message_id = self.state.delivery.new_message_id()

        def answer(payload: dict[str, Any]) -> bytes:
            return encode(
                Message(
                    LOBBY_ID,
                    agent.agent_id,
                    MessageType.SERVICES_AVAILABLE,
                    payload,
                    msg.conversation_id,
                    message_id=message_id,
                )
            )

        # The payload may take what the bound leaves beside the envelope (whose own "{}" is
        # the payload's place).
        room = self.state.limits.max_discover_bytes - len(answer({})) + 2
        try:
            payload = services_available(self.state.registry, agent.agent_id, query, room=room)
        except BadDiscovery as bad:
            return self.state.error(session, msg, ErrorCode.MALFORMED, str(bad))
        return [Send(session, answer(payload))]

    def update_capabilities(
        self, session: Session, agent: AgentRecord, msg: Message
    ) -> list[Action]:
        require_lobby_receiver(msg)
        update = validate(UpdateCapabilitiesPayload, msg)
        self.registrar.check_capabilities(update.capabilities)
        self.state.registry.set_capabilities(agent, update.capabilities)
        self.state.save(agent)
        log.info(
            "AGENT_CAPABILITIES_UPDATED",
            agent_id=agent.agent_id,
            capabilities=clip(", ".join(sorted(agent.capabilities)), MAX_SENTENCE_LENGTH),
        )
        return []

    def unregister(self, session: Session, agent: AgentRecord, msg: Message) -> list[Action]:
        require_lobby_receiver(msg)
        self.state.registry.remove(agent.agent_id)
        agent.session = None
        session.agent = None
        self.state.removed(agent.agent_id)
        log.info("AGENT_UNREGISTERED", agent_id=agent.agent_id, dropped=len(agent.mailbox))
        return [Close(session, CloseCode.UNREGISTERED, "unregistered")]
