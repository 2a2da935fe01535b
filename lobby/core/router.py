"""The routing core: a frame in, a list of actions out. No await, no socket, no file.

`Router.handle(session, frame)` is the whole lobby as a function of its state: it decodes the
frame once, authenticates it against the session's agent, decides (registration, discovery,
authorization, conversation tracking) and returns the `Send`/`Close` actions the I/O layer must
carry out. Every refusal is an ERROR (or, for REQUESTs refused by authorization, the seed's error
RESPONSE) to the sender alone; nothing is forwarded and no state changes.

The REQUEST/RESPONSE path is the hot path: one decode, one SHA-256 of the token, a few dict
lookups and one encode. Per-message logging is at DEBUG, filtered out by default.
"""

from __future__ import annotations

import hmac
import time
import uuid
from collections.abc import Callable
from typing import Any, Final, NoReturn, TypeVar

import orjson
import structlog

from lobby.core.commerce import DEFAULT_DIALOGUE_TIMEOUT, Ledger, Marketplace, Negotiations
from lobby.core.conversations import ConversationKey, Conversations
from lobby.core.counters import Counters
from lobby.core.delivery import (
    DEFAULT_DEDUPE_HORIZON,
    DEFAULT_DEDUPE_MAX,
    Delivery,
    MailboxFull,
)
from lobby.core.discovery import BadDiscovery, services_available
from lobby.core.limits import Limits, TokenBucket
from lobby.core.refusal import (
    Refusal,
    hash_token,
    require_lobby_receiver,
    unknown_receiver,
    validate,
)
from lobby.core.registration import Registrar
from lobby.core.registry import REVOKED, AgentRecord, Registry
from lobby.core.session import Action, Close, Send, Session
from lobby.store.base import AgentRemoved, AgentSaved, Compaction, Effect, Snapshot, StateSaved
from protocol.codec import decode, encode
from protocol.errors import DecodeError
from protocol.limits import MAX_SENTENCE_LENGTH, clip
from protocol.models import (
    LOBBY_ID,
    Capability,
    CloseCode,
    DiscoverServicesPayload,
    ErrorCode,
    FetchMessagesPayload,
    Message,
    MessageType,
    RegisterPayload,
    UpdateCapabilitiesPayload,
    close_code_name,
)

log = structlog.get_logger("lobby")
_P = TypeVar(
    "_P",
    RegisterPayload,
    DiscoverServicesPayload,
    UpdateCapabilitiesPayload,
    FetchMessagesPayload,
)

DEFAULT_MAILBOX_LIMIT: Final = 10_000

_LOBBY_ONLY: Final = frozenset(
    {
        MessageType.REGISTER_ACK,
        MessageType.SERVICES_AVAILABLE,
        MessageType.ERROR,
        MessageType.ACCEPTED,
        MessageType.TRANSACTION_CONFIRMED,
        MessageType.DIALOGUE_EXPIRED,
        MessageType.TRANSACTIONS,
        MessageType.PAYMENT_CONFIRMED,
        MessageType.MESSAGES,
    }
)


class Router:
    """The lobby's decisions and state. Call `open` when a connection is accepted, `handle` for
    every text message it sends (its UTF-8 bytes, or the `str`), `binary` for a binary one, and
    `close` when it is gone; carry out the returned actions in order."""

    def __init__(
        self,
        *,
        mailbox_limit: int = DEFAULT_MAILBOX_LIMIT,
        dedupe_horizon: float = DEFAULT_DEDUPE_HORIZON,
        dedupe_max: int = DEFAULT_DEDUPE_MAX,
        limits: Limits | None = None,
        clock: Callable[[], float] = time.time,
        trace: bool = False,
        dialogue_timeout: float = DEFAULT_DIALOGUE_TIMEOUT,
    ) -> None:
        self.registry = Registry()
        self.trace = trace
        """Log every routed message at DEBUG. Off, a message costs no logging call at all
        (even a filtered-out structlog call costs about a microsecond)."""
        self.limits = limits or Limits()
        self.registrar = Registrar(self, self.limits)
        self.requests = Conversations(self)
        """Open REQUESTs: how many final RESPONSEs each key still expects."""
        self.counters = Counters()
        """What /metrics reads: routed messages by type, refusals by code."""
        # Lobby-assigned message ids: unique per process start, cheap to make.
        self.delivery = Delivery(
            id_prefix=uuid.uuid4().hex[:12],
            mailbox_limit=mailbox_limit,
            dedupe_horizon=dedupe_horizon,
            dedupe_max=dedupe_max,
            counters=self.counters,
        )
        self.clock = clock
        self.ledger = Ledger()
        self.negotiations = Negotiations(self, timeout=dialogue_timeout, remember=dedupe_horizon)
        self.market = Marketplace(self)
        move = self.negotiations.move
        self._routed: dict[MessageType, Callable[[Session, AgentRecord, Message], list[Action]]]
        self._routed = {
            MessageType.CFP: move,
            MessageType.PROPOSE: move,
            MessageType.ACCEPT: move,
            MessageType.DECLINE: move,
            MessageType.MATCH_ACCEPT: move,
            MessageType.TEXT: self.market.text,
            MessageType.ORDER_PROPOSAL: self.market.order_proposal,
            MessageType.PAYMENT: self.market.payment,
        }
        self._lobby_handlers: dict[
            MessageType, Callable[[Session, AgentRecord, Message], list[Action]]
        ] = {
            MessageType.ACK: self._ack,
            MessageType.FETCH_MESSAGES: self._fetch_messages,
            MessageType.LIST_TRANSACTIONS: self._list_transactions,
            MessageType.DISCOVER_SERVICES: self._discover_services,
            MessageType.UPDATE_CAPABILITIES: self._update_capabilities,
            MessageType.UNREGISTER: self._unregister,
        }

    # -- persistence ----------------------------------------------------------------------

    def restore(self, snapshot: Snapshot) -> None:
        """Rebuild the state from a store's snapshot; call once, before any connection."""
        for saved in snapshot.agents:
            record = AgentRecord(saved.agent_id, saved.token_hash, acks=saved.acks)
            self.registry.add(record)
            capabilities = [Capability.model_validate(c) for c in orjson.loads(saved.capabilities)]
            self.registry.set_capabilities(record, capabilities)
        self.requests.restore(self.delivery.restore(snapshot, self.registry.agents))
        transactions = [orjson.loads(t) for t in snapshot.state.get("transaction", [])]
        self.ledger.transactions = transactions
        self.negotiations.restore(snapshot.state.get("dialogue", []))
        self.market.restore(snapshot.state.get("proposal", []), transactions)
        log.info(
            "LOBBY_RESTORED",
            agents=len(snapshot.agents),
            held_messages=sum(len(a.mailbox) for a in self.registry.agents.values()),
            open_conversations=len(self.requests.open),
        )

    def compaction(self) -> Compaction:
        """A checkpoint for `Store.compact`; also trims the in-memory dedupe window."""
        now = self.clock()
        delivery = self.delivery
        delivery.forget_old(now)
        self.registrar.forget_idle(now)
        return Compaction(
            conversations=dict(self.requests.open),
            upto_row=delivery.last_row,
            acked={a.agent_id: a.acked_seq for a in self.registry.agents.values()},
            forget_before=now - delivery.dedupe_horizon,
        )

    @property
    def conversations(self) -> dict[ConversationKey, int]:
        """Open REQUEST conversations -> REQUESTs waiting for a final RESPONSE."""
        return self.requests.open

    # -- connection lifecycle -------------------------------------------------------------

    def open(self, remote: str = "", link: object = None, host: str = "") -> Session:
        return Session(remote, link, host)

    def close(self, session: Session, code: int | None = None) -> list[Action]:
        """The connection of `session` is closing or gone (`code`: the close code, when one is
        known): its agent (if any) goes offline at once, so what is sent to it from now on is
        held for its resume. Safe to call more than once."""
        agent = session.agent
        session.agent = None
        if agent is not None and agent.session is session:
            agent.session = None
            log.info(
                "AGENT_DISCONNECTED",
                agent_id=agent.agent_id,
                close_code=code,
                close=close_code_name(code),
            )
        return []

    # -- frames ---------------------------------------------------------------------------

    @staticmethod
    def _prove(session: Session, agent: AgentRecord, token: str) -> bool:
        if not hmac.compare_digest(hash_token(token), agent.token_hash):
            return False
        session.proven = (agent, token)
        return True

    def binary(self, session: Session) -> list[Action]:
        return self._error(
            session,
            None,
            ErrorCode.MALFORMED,
            "binary frames are not accepted: send each message as JSON in a text frame",
        )

    def handle(self, session: Session, frame: str | bytes) -> list[Action]:
        """One text message; bytes are decoded as UTF-8 by the JSON parser itself."""
        try:
            msg = decode(frame)
        except DecodeError as exc:
            return self._error(
                session,
                None,
                ErrorCode.MALFORMED,
                exc.reason,
                message_type=exc.message_type,
                conversation_id=exc.conversation_id,
            )
        agent = session.agent
        if agent is None:
            return self._unregistered(session, msg)
        token = msg.auth_token
        proven = session.proven
        if (
            msg.sender_id != agent.agent_id
            or type(token) is not str
            or not (
                # A plain compare is safe: the token it is compared with is one this same
                # connection already presented.
                (proven is not None and proven[0] is agent and proven[1] == token)
                or self._prove(session, agent, token)
            )
        ):
            return self._auth_failed(session, agent, msg)
        bucket = agent.bucket
        if bucket is not None and not bucket.take(self.clock()):
            return self._error(
                session,
                msg,
                ErrorCode.RATE_LIMITED,
                f"agent {agent.agent_id!r} sends more than {self.limits.message_rate:g} "
                "messages a second; this one was not routed",
            )
        try:
            mtype = msg.message_type
            if mtype is MessageType.REQUEST:
                return self.requests.request(session, agent, msg)
            if mtype is MessageType.RESPONSE:
                return self.requests.response(session, agent, msg)
            routed = self._routed.get(mtype)
            if routed is not None:
                return routed(session, agent, msg)
            if mtype is MessageType.REGISTER:
                raise Refusal(
                    ErrorCode.ALREADY_REGISTERED,
                    f"this connection is already registered as {agent.agent_id!r}",
                )
            if mtype in _LOBBY_ONLY:
                raise Refusal(
                    ErrorCode.MALFORMED,
                    f"{mtype} is sent by the lobby only"
                    + (
                        "; answer a REQUEST with a RESPONSE whose status is 'error'"
                        if mtype is MessageType.ERROR
                        else ""
                    ),
                )
            require_lobby_receiver(msg)
            return self._lobby_handlers[mtype](session, agent, msg)
        except Refusal as refusal:
            return self._error(session, msg, refusal.code, refusal.reason)

    # -- REGISTER -------------------------------------------------------------------------

    def _unregistered(self, session: Session, msg: Message) -> list[Action]:
        if msg.message_type is not MessageType.REGISTER:
            return self._error(
                session,
                msg,
                ErrorCode.NOT_REGISTERED,
                "this connection is not registered: its first message must be REGISTER",
            )
        try:
            return self.registrar.register(session, msg)
        except Refusal as refusal:
            return self._error(session, msg, refusal.code, refusal.reason)

    def save(self, record: AgentRecord) -> None:
        """Journal an agent's registration (token hash, capabilities, acks)."""
        capabilities = orjson.dumps([entry.wire for entry in record.capabilities.values()])
        self.delivery.journal.append(
            AgentSaved(record.agent_id, record.token_hash, capabilities, record.acks)
        )

    # -- messages to the lobby ------------------------------------------------------------

    def _ack(self, session: Session, agent: AgentRecord, msg: Message) -> list[Action]:
        up_to = msg.payload.get("up_to")
        if type(up_to) is not int or up_to < 0:
            raise Refusal(
                ErrorCode.MALFORMED, "an ACK payload needs a non-negative integer 'up_to'"
            )
        self.delivery.acknowledge(agent, up_to)
        return []

    def tick(self) -> list[Action]:
        """Time passed: end the dialogues whose deadline is gone, forget those that ended
        longer ago than the dedupe horizon. Call about once a second."""
        now = self.clock()
        self.negotiations.forget_ended(now)
        return self.negotiations.expire_due(now)

    def _list_transactions(
        self, session: Session, agent: AgentRecord, msg: Message
    ) -> list[Action]:
        payload = {"transactions": self.ledger.of(agent.agent_id)}
        return [self.reply(session, MessageType.TRANSACTIONS, payload, msg)]

    def _fetch_messages(self, session: Session, agent: AgentRecord, msg: Message) -> list[Action]:
        """The mailbox pull: what is held for the agent after `since` (which acknowledges
        everything up to it). Push delivery reads the same mailbox."""
        query = validate(FetchMessagesPayload, msg)
        if query.since is not None:
            self.delivery.acknowledge(agent, query.since)
        after = query.since or 0
        held = [(seq, frame) for seq, frame in agent.mailbox if seq > after][: query.limit]
        cursor = held[-1][0] if held else max(after, agent.acked_seq)
        payload = {"messages": [orjson.Fragment(frame) for _, frame in held], "cursor": cursor}
        return [self.reply(session, MessageType.MESSAGES, payload, msg)]

    def _limit_discovery(self, agent: AgentRecord) -> None:
        limits = self.limits
        if not limits.discover_rate:
            return
        now = self.clock()
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

    def _discover_services(
        self, session: Session, agent: AgentRecord, msg: Message
    ) -> list[Action]:
        self._limit_discovery(agent)
        query = validate(DiscoverServicesPayload, msg)
        message_id = self.delivery.new_message_id()

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
        room = self.limits.max_discover_bytes - len(answer({})) + 2
        try:
            payload = services_available(self.registry, agent.agent_id, query, room=room)
        except BadDiscovery as bad:
            raise Refusal(ErrorCode.MALFORMED, str(bad)) from None
        return [Send(session, answer(payload))]

    def _update_capabilities(
        self, session: Session, agent: AgentRecord, msg: Message
    ) -> list[Action]:
        update = validate(UpdateCapabilitiesPayload, msg)
        self.registrar.check_capabilities(update.capabilities)
        self.registry.set_capabilities(agent, update.capabilities)
        self.save(agent)
        log.info(
            "AGENT_CAPABILITIES_UPDATED",
            agent_id=agent.agent_id,
            capabilities=clip(", ".join(sorted(agent.capabilities)), MAX_SENTENCE_LENGTH),
        )
        return []

    def _unregister(self, session: Session, agent: AgentRecord, msg: Message) -> list[Action]:
        self.registry.remove(agent.agent_id)
        agent.session = None
        session.agent = None
        self.delivery.journal.append(AgentRemoved(agent.agent_id))
        log.info("AGENT_UNREGISTERED", agent_id=agent.agent_id, dropped=len(agent.mailbox))
        return [Close(session, CloseCode.UNREGISTERED, "unregistered")]

    def revoke(self, agent_id: str, *, remove: bool = False) -> list[Action] | None:
        """An operator's `lobby revoke` (the token stops working; the agent keeps its
        capabilities and mailbox, and the next REGISTER of its id without a token gets a new
        one) or `lobby remove` (the agent, its capabilities and what is held for it are gone).
        Journaled like any change; its connection is closed with 4003. None: no such agent."""
        agent = self.registry.get(agent_id)
        if agent is None:
            return None
        session, agent.session = agent.session, None
        if remove:
            self.registry.remove(agent_id)
            self.delivery.journal.append(AgentRemoved(agent_id))
        else:
            agent.token_hash = REVOKED
            self.save(agent)
        log.info("AGENT_REMOVED" if remove else "AGENT_TOKEN_REVOKED", agent_id=agent_id)
        if session is None:
            return []
        session.agent = None
        reason = "removed by an operator" if remove else "token revoked by an operator"
        return [Close(session, CloseCode.UNREGISTERED, reason)]

    # -- delivery -------------------------------------------------------------------------

    # -- helpers for the handlers (here and in commerce.py) --------------------------------

    def deliver(
        self, target: AgentRecord, msg: Message, sender: Session | None, effect: int, now: float
    ) -> list[Action]:
        """Accept `msg` for `target` (see Delivery.accept); a full mailbox refuses it."""
        try:
            return self.delivery.accept(target, msg, sender=sender, effect=effect, now=now)
        except MailboxFull as full:
            raise Refusal(ErrorCode.MAILBOX_FULL, str(full)) from None

    @staticmethod
    def refuse(code: ErrorCode, reason: str) -> NoReturn:
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
    ) -> list[Action]:
        """A lobby notice to each agent, delivered like any message (stored, acknowledged)."""
        actions: list[Action] = []
        for agent_id in agent_ids:
            target = self.registry.agents.get(agent_id)
            if target is not None:
                notice = Message(LOBBY_ID, agent_id, message_type, payload, conversation_id)
                actions += self.delivery.accept(
                    target, notice, sender=None, effect=Effect.NONE, now=now, force=True
                )
        return actions

    def record(self, tx: dict[str, Any]) -> None:
        """Add a transaction to the ledger, durably."""
        self.ledger.transactions.append(tx)
        data = orjson.dumps(tx)
        self.delivery.journal.append(StateSaved("transaction", tx["transaction_id"], data))

    def reply(
        self, session: Session, message_type: MessageType, payload: dict[str, Any], msg: Message
    ) -> Send:
        """A direct answer from the lobby to the sender of `msg` (not stored)."""
        frame = self.from_lobby(
            msg.sender_id, message_type, payload, msg.conversation_id, msg.message_id
        )
        return Send(session, frame)

    def from_lobby(
        self,
        receiver_id: str,
        message_type: MessageType,
        payload: dict[str, Any],
        conversation_id: str | None = None,
        in_reply_to: str | None = None,
    ) -> bytes:
        return encode(
            Message(
                LOBBY_ID,
                receiver_id,
                message_type,
                payload,
                conversation_id,
                message_id=self.delivery.new_message_id(),
                in_reply_to=in_reply_to,
            )
        )

    # -- refusals -------------------------------------------------------------------------

    def _auth_failed(self, session: Session, agent: AgentRecord, msg: Message) -> list[Action]:
        if msg.sender_id != agent.agent_id:
            reason = (
                f"sender_id {clip(msg.sender_id)!r} is not the agent registered on this connection "
                f"({agent.agent_id!r})"
            )
        elif msg.auth_token is None:
            reason = "missing auth_token: every message after REGISTER must carry it"
        else:
            reason = f"invalid auth_token for agent {agent.agent_id!r}"
        log.warning("AUTHENTICATION_FAILED", agent_id=agent.agent_id, reason=reason)
        return self._error(session, msg, ErrorCode.AUTH_FAILED, reason)

    def _error(
        self,
        session: Session,
        msg: Message | None,
        code: ErrorCode,
        reason: str,
        *,
        message_type: str | None = None,
        conversation_id: str | None = None,
    ) -> list[Action]:
        self.counters.refused[code] += 1
        original_id = None
        if msg is not None:
            message_type = msg.message_type
            conversation_id = msg.conversation_id
            original_id = msg.message_id
        payload = {
            "error": clip(reason, MAX_SENTENCE_LENGTH),  # its quoted values are clipped already
            "code": code,
            "original_message_type": message_type,
            "original_conversation_id": conversation_id,
        }
        receiver = session.agent.agent_id if session.agent is not None else ""
        if not receiver and msg is not None:
            receiver = msg.sender_id
        if self.trace:
            log.debug("MESSAGE_REFUSED", code=code, reason=reason, session=session.id)
        frame = self.from_lobby(
            receiver, MessageType.ERROR, payload, conversation_id, in_reply_to=original_id
        )
        return [Send(session, frame)]
