"""The lobby's shared state, and the helpers every handler uses to act on it.

`LobbyState` is the one object the handlers (conversations.py, negotiation.py, marketplace.py,
registration.py, to_lobby.py) receive: the registry, the delivery state (mailboxes, dedupe
window, the journal), the ledger, the limits and the clock, plus the ways a handler answers:
`deliver` a message (once `is_duplicate` says it is new), `notify` agents, `reply` to a sender,
`refuse` (an ERROR to the sender, nothing changed), `record` a transaction, `save` an agent. It
is a leaf: it imports no handler and no router, and the router is only the entry point that
dispatches to the handlers (h11's `Connection` over its `ConnectionState`).
"""

from __future__ import annotations

import itertools
import time
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NoReturn

import orjson
import structlog

from lobby.core.counters import Counters
from lobby.core.delivery import (
    DEFAULT_DEDUPE_HORIZON,
    DEFAULT_DELIVERY_WINDOW,
    Delivery,
)
from lobby.core.discovery.presence import Presence
from lobby.core.discovery.registry import Registry
from lobby.core.limits import Limits
from lobby.core.records import (
    DEFAULT_DEDUPE_MAX,
    AgentRemoved,
    AgentSaved,
    Effect,
    Record,
    StateSaved,
)
from lobby.core.refusal import Refusal, error_payload, unknown_receiver
from lobby.core.session import Action, AgentRecord, Send, Session
from lobby.core.tracing import Tracing, trace_id
from protocol.codec import encode
from protocol.models import LOBBY_ID, ErrorCode, Message, MessageType

if TYPE_CHECKING:
    from lobby.core.cluster.shared import SharedRegistry

log = structlog.get_logger("lobby")


class Ledger:
    """Every transaction, in order, findable by party."""

    def __init__(self) -> None:
        self.transactions: list[dict[str, Any]] = []
        self.ids: set[str] = set()
        """The transaction_id of each transaction held (one held twice is recorded once)."""
        self._ids = itertools.count(1)
        self._prefix = uuid.uuid4().hex[:8]

    def load(self, transactions: list[dict[str, Any]]) -> None:
        self.transactions = transactions
        self.ids = {t["transaction_id"] for t in transactions}

    def new_id(self) -> str:
        return f"tx-{self._prefix}-{next(self._ids)}"

    def of(self, agent_id: str) -> list[dict[str, Any]]:
        return [t for t in self.transactions if agent_id in (t["buyer"], t["seller"])]


class LobbyState:
    """Owns what every handler shares: who is registered (`registry`), what is held for whom
    and what must be persisted (`delivery`, whose journal the router hands out), the `ledger`,
    the `limits` and the `clock`. Handlers change the state and build their answers only
    through it."""

    def __init__(
        self,
        *,
        mailbox_limit: int,
        dedupe_horizon: float = DEFAULT_DEDUPE_HORIZON,
        dedupe_max: int = DEFAULT_DEDUPE_MAX,
        delivery_window: int = DEFAULT_DELIVERY_WINDOW,
        limits: Limits | None = None,
        clock: Callable[[], float] = time.time,
        trace: bool = False,
        tracing: Tracing | None = None,
    ) -> None:
        self.registry = Registry()
        self.identity: str | None = None
        """The lobby's identity (`lobby.identity`), told in REGISTER_ACK; set by the server."""
        self.limits = limits or Limits()
        self.clock = clock
        self.trace = trace
        """Log every routed message at DEBUG. Off, a message costs no logging call at all
        (even a filtered-out structlog call costs about a microsecond)."""
        # Lobby-assigned message ids: unique per process start, cheap to make.
        self.counters = Counters()
        """What /metrics reads: routed messages by type, refusals by code."""
        self.delivery = Delivery(
            id_prefix=uuid.uuid4().hex[:12],
            mailbox_limit=mailbox_limit,
            dedupe_horizon=dedupe_horizon,
            dedupe_max=dedupe_max,
            window=delivery_window,
            counters=self.counters,
            tracing=tracing,
        )
        self.tracing = self.delivery.tracing
        self.ledger = Ledger()
        self.presence = Presence(self.registry, self.delivery.new_message_id, self.counters)
        """The watches agents hold (WATCH) and the PRESENCE each registration change causes."""
        self.shared: SharedRegistry | None = None
        """Cluster only (`Router.share`): the registry lobby nodes share; None on one node."""
        # The two delivery steps a forwarding handler takes, as the Delivery's own methods:
        # no wrapper call on the hot path, and the walk goes handler -> delivery, one way.
        self.is_duplicate = self.delivery.is_duplicate
        """Whether `msg` resends a message_id its sender already sent (it is then confirmed,
        and must be neither stored nor forwarded again)."""
        self.deliver = self._deliver_logged if trace else self.delivery.accept
        """Accept a message for its receiver: stamped, journaled, written or held; a full
        mailbox refuses it (`mailbox_full`) with nothing changed."""

    def _deliver_logged(
        self,
        target: AgentRecord,
        msg: Message,
        sender: Session | None,
        effect: int,
        now: float,
        force: bool = False,
    ) -> list[Action]:
        """`deliver` at DEBUG: one MESSAGE_ROUTED line per message (never its token)."""
        actions = self.delivery.accept(target, msg, sender, effect, now, force)
        log.debug(
            "MESSAGE_ROUTED",
            type=msg.message_type,
            sender=msg.sender_id,
            receiver=target.agent_id,
            conversation_id=msg.conversation_id,
            message_id=msg.message_id,
            seq=msg.seq,
            trace_id=trace_id(msg.traceparent),
        )
        return actions

    def journaled(self, record: Record) -> None:
        """Append `record` to the journal the next commit persists."""
        self.delivery.journal.append(record)

    # -- what a handler does --------------------------------------------------------------

    @staticmethod
    def refuse(code: ErrorCode, reason: str) -> NoReturn:
        """Answer the sender with an ERROR `code` and change nothing (the router catches it)."""
        raise Refusal(code, reason)

    def receiver(self, msg: Message) -> AgentRecord:
        """The registered agent `msg` is addressed to, or a refusal `unknown_receiver`."""
        target = self.registry.agents.get(msg.receiver_id)
        if target is None:
            raise Refusal(ErrorCode.UNKNOWN_RECEIVER, unknown_receiver(msg.receiver_id))
        return target

    def notify(
        self,
        agent_ids: tuple[str, ...],
        message_type: MessageType,
        payload: dict[str, Any],
        conversation_id: str | None,
        now: float,
        traceparent: str | None = None,
    ) -> list[Action]:
        """A lobby notice to each agent, delivered like any message (stored, acknowledged),
        in the trace (`traceparent`) of what caused it."""
        actions: list[Action] = []
        for agent_id in agent_ids:
            target = self.registry.agents.get(agent_id)
            if target is not None:
                notice = Message(
                    LOBBY_ID,
                    agent_id,
                    message_type,
                    payload,
                    conversation_id,
                    traceparent=traceparent,
                )
                actions += self.deliver(
                    target, notice, sender=None, effect=Effect.NONE, now=now, force=True
                )
        return actions

    def record(self, tx: dict[str, Any]) -> None:
        """Add a transaction to the ledger, durably."""
        if tx["transaction_id"] in self.ledger.ids:
            return  # known already: a trade decided on another node reaches it more than once
        self.ledger.transactions.append(tx)
        self.ledger.ids.add(tx["transaction_id"])
        data = orjson.dumps(tx)
        self.delivery.journal.append(StateSaved("transaction", tx["transaction_id"], data))

    def save(self, record: AgentRecord) -> None:
        """Journal an agent's registration (token hash, capabilities, acks)."""
        capabilities = orjson.dumps([entry.wire for entry in record.capabilities.values()])
        saved = AgentSaved(record.agent_id, record.token_hash, capabilities, record.acks)
        self.delivery.journal.append(saved)
        if self.shared is not None:
            self.shared.changes.append(saved)

    def removed(self, agent_id: str) -> None:
        """Journal that an agent is gone (UNREGISTER, `lobby remove`)."""
        removed = AgentRemoved(agent_id)
        self.delivery.journal.append(removed)
        if self.shared is not None:
            self.shared.changes.append(removed)

    def reply(
        self, session: Session, message_type: MessageType, payload: dict[str, Any], msg: Message
    ) -> Send:
        """A direct answer from the lobby to the sender of `msg` (not stored)."""
        frame = self.from_lobby(
            msg.sender_id,
            message_type,
            payload,
            msg.conversation_id,
            msg.message_id,
            traceparent=msg.traceparent,
        )
        return Send(session, frame)

    def told_accepted(self, session: Session, message_id: str | None) -> list[Action]:
        """ACCEPTED `message_id` (None: nothing more is settled) to the sender of `session`,
        some of whose messages waited on other nodes (`lobby.core.accepting`); its record goes
        once nothing waits."""
        unsettled = session.unsettled
        if unsettled is not None and unsettled.done:
            session.unsettled = None
        agent = session.agent
        if message_id is None or agent is None:
            return []
        payload = {"message_id": message_id}
        accepted = Message(LOBBY_ID, agent.agent_id, MessageType.ACCEPTED, payload)
        return [Send(session, encode(accepted))]

    def from_lobby(
        self,
        receiver_id: str,
        message_type: MessageType,
        payload: dict[str, Any],
        conversation_id: str | None = None,
        in_reply_to: str | None = None,
        *,
        traceparent: str | None = None,
    ) -> bytes:
        """A frame from the lobby, with a lobby-assigned message_id; in the trace of the
        message it answers (`traceparent`), if that had one."""
        msg = Message(
            LOBBY_ID,
            receiver_id,
            message_type,
            payload,
            conversation_id,
            message_id=self.delivery.new_message_id(),
            in_reply_to=in_reply_to,
        )
        if traceparent is not None:
            msg.traceparent = traceparent
            msg.traceparent = self.tracing.hop(msg, receiver_id)
        return encode(msg)

    def error(
        self,
        session: Session,
        msg: Message | None,
        code: ErrorCode,
        reason: str,
        *,
        message_type: str | None = None,
        conversation_id: str | None = None,
        in_reply_to: str | None = None,
    ) -> list[Action]:
        """The ERROR that refuses `msg` (or an undecodable frame: then `message_type`,
        `conversation_id` and `in_reply_to` say what could be read of it), to its sender
        alone."""
        self.counters.refused[code] += 1
        original_id, traceparent = in_reply_to, None
        if msg is not None:
            traceparent = msg.traceparent
            message_type = msg.message_type
            conversation_id = msg.conversation_id
            original_id = msg.message_id
        payload = error_payload(code, reason, message_type, conversation_id)
        receiver = session.agent.agent_id if session.agent is not None else ""
        if not receiver and msg is not None:
            receiver = msg.sender_id
        if self.trace:
            log.debug(
                "MESSAGE_REFUSED",
                code=code,
                reason=reason,
                session=session.id,
                trace_id=trace_id(traceparent),
            )
        frame = self.from_lobby(
            receiver,
            MessageType.ERROR,
            payload,
            conversation_id,
            in_reply_to=original_id,
            traceparent=traceparent,
        )
        return [Send(session, frame)]
