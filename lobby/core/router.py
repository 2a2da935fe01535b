"""The routing core: a frame in, a list of actions out. No await, no socket, no file.

`Router.handle(session, frame)` is the whole lobby as a function of its state: it decodes the
frame once, authenticates it against the session's agent, and hands the message to the handler
its type names in one table (`_handlers`); the handler decides (registration, discovery,
authorization, conversation tracking) and returns the `Send`/`Close` actions the I/O layer must
carry out. The handlers share one `LobbyState` (state.py) and never see the router. What must be
persisted leaves by one route too: `take_journal()`, then `committed()` once it is durable.
Every refusal is an ERROR (or, for REQUESTs refused by authorization, the seed's error RESPONSE)
to the sender alone; nothing is forwarded and no state changes.

The REQUEST/RESPONSE path is the hot path: one decode, one SHA-256 of the token, a few dict
lookups and one encode. Per-message logging is at DEBUG, filtered out by default.
"""

from __future__ import annotations

import hmac
import time
from collections import deque
from collections.abc import Callable
from typing import Final

import orjson
import structlog

from lobby.core.addressed import Addressing
from lobby.core.cluster.between_nodes import BetweenNodes
from lobby.core.commerce.marketplace import Marketplace
from lobby.core.commerce.negotiation import DEFAULT_DIALOGUE_TIMEOUT, Negotiations
from lobby.core.conversations import ConversationKey, Conversations
from lobby.core.counters import Counters
from lobby.core.delivery import (
    DEFAULT_DEDUPE_HORIZON,
    DEFAULT_DELIVERY_WINDOW,
    Delivery,
)
from lobby.core.discovery.registry import Registry
from lobby.core.limits import Limits, pause_after
from lobby.core.records import DEFAULT_DEDUPE_MAX, Batch, Compaction, Record, Snapshot
from lobby.core.refusal import Refusal, error_payload, hash_token
from lobby.core.registration import Registrar
from lobby.core.session import REVOKED, Action, AgentRecord, Close, Pause, Send, Session
from lobby.core.state import Ledger, LobbyState
from lobby.core.to_lobby import ToLobby, WaitingQuery
from lobby.core.tracing import Tracing
from protocol.codec import decode, encode
from protocol.errors import DecodeError
from protocol.limits import clip
from protocol.models import LOBBY_ID, CloseCode, ErrorCode, Message, MessageType, close_code_name
from protocol.payloads import Capability

log = structlog.get_logger("lobby")
Handler = Callable[[Session, AgentRecord, Message], list[Action]]
"""What the dispatch table maps each message type to: the sender's session, its (proven)
agent, the message; the actions to carry out. A handler raises `Refusal` to refuse."""

DEFAULT_MAILBOX_LIMIT: Final = 10_000

_MOVED: Final = frozenset((CloseCode.REPLACED, CloseCode.SERVICE_RESTART, CloseCode.TRY_AGAIN))
"""Close codes after which an agent's connection resumes elsewhere (a newer connection, another
node of the cluster) with what it holds: what it was serving does not fail over."""

_LOBBY_ONLY: Final = frozenset(
    {
        MessageType.REGISTER_ACK,
        MessageType.SERVICES_AVAILABLE,
        MessageType.ERROR,
        MessageType.ACCEPTED,
        MessageType.TRANSACTION_CONFIRMED,
        MessageType.DIALOGUE_EXPIRED,
        MessageType.BIDS_REVEALED,
        MessageType.TRANSACTIONS,
        MessageType.PAYMENT_CONFIRMED,
        MessageType.MESSAGES,
        MessageType.PRESENCE,
    }
)


class Router(BetweenNodes):
    """The lobby's sans-I/O entry point: owns the dispatch table and the handlers, over one
    `LobbyState`. Call `open` when a connection is accepted, `handle` for every text message it
    sends (its UTF-8 bytes, or the `str`), `binary` for a binary one, and `close` when it is
    gone; carry out the returned actions in order. Take the journal (`take_journal`) to commit
    it, and carry out `committed(batch)` once it is durable."""

    def __init__(
        self,
        *,
        mailbox_limit: int = DEFAULT_MAILBOX_LIMIT,
        dedupe_horizon: float = DEFAULT_DEDUPE_HORIZON,
        dedupe_max: int = DEFAULT_DEDUPE_MAX,
        delivery_window: int = DEFAULT_DELIVERY_WINDOW,
        limits: Limits | None = None,
        clock: Callable[[], float] = time.time,
        trace: bool = False,
        dialogue_timeout: float = DEFAULT_DIALOGUE_TIMEOUT,
        tracing: Tracing | None = None,
    ) -> None:
        self.state = state = LobbyState(
            mailbox_limit=mailbox_limit,
            dedupe_horizon=dedupe_horizon,
            dedupe_max=dedupe_max,
            delivery_window=delivery_window,
            limits=limits,
            clock=clock,
            trace=trace,
            tracing=tracing,
        )
        self.registrar = Registrar(state)
        self.requests = Conversations(state)
        """Open REQUESTs: how many final RESPONSEs each key still expects."""
        self.addressed = Addressing(state, self.requests)
        """REQUESTs naming a capability: the provider chosen, and failover when it goes."""
        self.negotiations = Negotiations(state, timeout=dialogue_timeout, remember=dedupe_horizon)
        self.market = Marketplace(state)
        self.to_lobby = ToLobby(state, self.registrar)
        self._parked: dict[str, list[tuple[Session, Message]]] = {}
        """A cluster node's messages waiting for their receiver's lookup (`looked_up`)."""
        self.given_up: dict[str, list[Record]] = {}
        """A cluster node's agents handed over, not yet confirmed adopted (`released`)."""
        move, to_lobby = self.negotiations.move, self.to_lobby
        # The one dispatch table: every message type a registered agent may send, and a
        # refusal for each one it may not.
        self._handlers: dict[MessageType, Handler] = {
            MessageType.REQUEST: self.requests.request,
            MessageType.RESPONSE: self.requests.response,
            MessageType.INPUT: self.requests.turns.input,
            MessageType.CFP: move,
            MessageType.PROPOSE: move,
            MessageType.ACCEPT: move,
            MessageType.DECLINE: move,
            MessageType.MATCH_ACCEPT: move,
            MessageType.TEXT: self.market.text,
            MessageType.ORDER_PROPOSAL: self.market.order_proposal,
            MessageType.PAYMENT: self.market.payment,
            MessageType.ACK: to_lobby.ack,
            MessageType.FETCH_MESSAGES: to_lobby.fetch_messages,
            MessageType.LIST_TRANSACTIONS: to_lobby.list_transactions,
            MessageType.DISCOVER_SERVICES: to_lobby.discover_services,
            MessageType.UPDATE_CAPABILITIES: to_lobby.update_capabilities,
            MessageType.UNREGISTER: self._unregister,
            MessageType.WATCH: state.presence.watch,
            MessageType.UNWATCH: state.presence.unwatch,
            MessageType.CANCEL: self.requests.deadlines.cancel,
            MessageType.REGISTER: _already_registered,
            **dict.fromkeys(_LOBBY_ONLY, _sent_by_the_lobby_only),
        }

    # The shared state, as the router's callers (the server, tests) read it.

    @property
    def registry(self) -> Registry:
        return self.state.registry

    @property
    def delivery(self) -> Delivery:
        return self.state.delivery

    @property
    def ledger(self) -> Ledger:
        return self.state.ledger

    @property
    def limits(self) -> Limits:
        return self.state.limits

    @property
    def clock(self) -> Callable[[], float]:
        return self.state.clock

    @property
    def counters(self) -> Counters:
        return self.state.counters

    # -- DISCOVER_SERVICES waiting in line ------------------------------------------------

    @property
    def queries(self) -> deque[WaitingQuery]:
        """DISCOVER_SERVICES accepted and not yet answered, oldest first: the I/O layer calls
        `answer_query` for one per pass of its loop while any wait (or hands them to a replica
        of the index with `to_lobby.take_query` and `to_lobby.answered`)."""
        return self.to_lobby.queries

    def answer_query(self) -> list[Action]:
        """Answer the oldest waiting DISCOVER_SERVICES (`ToLobby.answer_query`)."""
        return self.to_lobby.answer_query()

    # -- persistence ----------------------------------------------------------------------

    def restore(self, snapshot: Snapshot) -> None:
        """Rebuild the state from a store's snapshot; call once, before any connection."""
        for saved in snapshot.agents:
            record = AgentRecord(saved.agent_id, saved.token_hash, acks=saved.acks)
            self.registry.add(record)
            capabilities = [Capability.model_validate(c) for c in orjson.loads(saved.capabilities)]
            self.registry.set_capabilities(record, capabilities)
        self.delivery.restore(snapshot, self.registry.agents)
        self.requests.restore(snapshot)
        self.addressed.restore(snapshot)
        transactions = [orjson.loads(t) for t in snapshot.state.get("transaction", [])]
        self.ledger.load(transactions)
        self.negotiations.restore(snapshot.state.get("dialogue", []))
        self.negotiations.restore_rounds(snapshot.state.get("sealed_round", []))
        self.market.restore(snapshot.state.get("proposal", []), transactions)
        log.info(
            "LOBBY_RESTORED",
            agents=len(snapshot.agents),
            held_messages=sum(len(a.mailbox) for a in self.registry.agents.values()),
            open_conversations=len(self.requests.open),
        )

    def compaction(self) -> Compaction:
        """A checkpoint for `Store.compact`; also trims the in-memory dedupe window."""
        now = self.state.clock()
        delivery = self.state.delivery
        delivery.forget_old(now)
        self.registrar.forget_idle(now)
        acked = {a.agent_id: a.acked_seq for a in self.registry.agents.values()}
        for agent_id in self.given_up:
            # Handed over, not yet confirmed adopted: its messages stay whole in the store, so
            # a failover of this node meanwhile still finds them (`lobby.core.cluster.handover`).
            acked[agent_id] = 0
        return Compaction(
            conversations=dict(self.requests.open),
            upto_row=delivery.last_row,
            acked=acked,
            forget_before=now - delivery.dedupe_horizon,
        )

    # -- the journal ------------------------------------------------------------------------

    @property
    def journal_pending(self) -> bool:
        """Whether records or confirmations wait for a commit (`take_journal`)."""
        return self.delivery.pending

    def take_journal(self) -> Batch:
        """What must be persisted now, as one group commit: hand its `records` to
        `Store.write()` and, once they are durable, call `committed(batch)`."""
        return self.delivery.take_journal()

    def committed(self, batch: Batch) -> list[Action]:
        """The actions a durable commit causes: each acknowledging sender still connected is
        told (ACCEPTED) the last of its messages in `batch`."""
        actions: list[Action] = []
        traces = batch.traces
        for session, message_id in batch.accepted.items():
            agent = session.agent
            unsettled = session.unsettled
            if unsettled is not None and unsettled.taken is not None:
                # Some of its messages wait on other nodes: told what is settled, in order.
                actions += self.state.told_accepted(session, unsettled.committed())
            elif agent is not None and agent.home is None:  # a relay session's: `stored_away`
                accepted = Message(
                    LOBBY_ID, agent.agent_id, MessageType.ACCEPTED, {"message_id": message_id}
                )
                if traces and (traceparent := traces.get(session)) is not None:
                    accepted.traceparent = traceparent
                    accepted.traceparent = self.state.tracing.hop(accepted, agent.agent_id)
                actions.append(Send(session, encode(accepted)))
        return actions

    @property
    def conversations(self) -> dict[ConversationKey, int]:
        """Open REQUEST conversations -> REQUESTs waiting for a final RESPONSE."""
        return self.requests.open

    # -- connection lifecycle -------------------------------------------------------------

    def open(self, remote: str = "", link: object = None, host: str = "") -> Session:
        return Session(remote, link, host)

    def close(
        self, session: Session, code: int | None = None, *, quiet: bool = False
    ) -> list[Action]:
        """The connection of `session` is closing or gone (`code`: the close code, when one is
        known): its agent (if any) goes offline at once, so what is sent to it from now on is
        held for its resume. Safe to call more than once. `quiet`: the lobby is stopping and
        says so once for every connection, not once per agent."""
        agent = session.agent
        session.agent = None
        shared = self.state.shared
        if shared is not None and (
            shared.claims or shared.waiting or shared.releasing or shared.failing_over
        ):
            shared.closed(session)
        presence = self.state.presence
        presence.dropped(session)
        if agent is not None and agent.session is session:
            agent.session = None
            if not quiet:
                log.info(
                    "AGENT_DISCONNECTED",
                    agent_id=agent.agent_id,
                    close_code=code,
                    close=close_code_name(code),
                )
            told = presence.went_offline(agent)
            if code not in _MOVED:
                return [*told, *self.addressed.provider_gone(agent)]
            return told
        return []

    # -- operators ------------------------------------------------------------------------

    def revoke(self, agent_id: str, *, remove: bool = False) -> list[Action] | None:
        """An operator's `lobby revoke` (the token stops working; the agent keeps its
        capabilities and mailbox, and the next REGISTER of its id without a token gets a new
        one) or `lobby remove` (the agent, its capabilities and what is held for it are gone).
        Journaled like any change; its connection is closed with 4003. None: no such agent."""
        state = self.state
        agent = state.registry.get(agent_id)
        if agent is None:
            return None
        session, agent.session = agent.session, None
        if remove:
            state.registry.remove(agent_id)
            state.removed(agent_id)
            told = state.presence.removed(agent)
        else:
            agent.token_hash = REVOKED
            state.save(agent)
            told = state.presence.went_offline(agent) if session is not None else []
        log.info("AGENT_REMOVED" if remove else "AGENT_TOKEN_REVOKED", agent_id=agent_id)
        failed_over = self.addressed.provider_gone(agent)
        if session is None:
            return [*told, *failed_over]
        session.agent = None
        reason = "removed by an operator" if remove else "token revoked by an operator"
        return [Close(session, CloseCode.UNREGISTERED, reason), *told, *failed_over]

    # -- frames ---------------------------------------------------------------------------

    @staticmethod
    def _prove(session: Session, agent: AgentRecord, token: str) -> bool:
        if not hmac.compare_digest(hash_token(token), agent.token_hash):
            return False
        session.proven = (agent, token)
        return True

    def failed(self, session: Session) -> list[Action]:
        """The answer to a message whose handling raised (a bug in the core): an ERROR
        `internal`, and nothing routed. The I/O layer calls this instead of `handle`'s result."""
        payload = error_payload(
            ErrorCode.INTERNAL,
            "the lobby failed to process this message; nothing was routed",
            None,
            None,
        )
        return [Send(session, encode(Message(LOBBY_ID, "", MessageType.ERROR, payload)))]

    def binary(self, session: Session) -> list[Action]:
        return self.state.error(
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
            return self.state.error(
                session,
                None,
                ErrorCode.MALFORMED,
                exc.reason,
                message_type=exc.message_type,
                conversation_id=exc.conversation_id,
                in_reply_to=exc.message_id,
            )
        agent = session.agent
        if agent is None:
            return self._unregistered(session, msg)
        state = self.state
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
        if bucket is not None and not bucket.take(state.clock()):
            refused = state.error(
                session,
                msg,
                ErrorCode.RATE_LIMITED,
                f"agent {agent.agent_id!r} sends more than {state.limits.message_rate:g} "
                "messages a second; this one was not routed",
            )
            refused.append(Pause(session, pause_after(bucket)))
            return refused
        if msg.deadline is not None:
            return state.error(
                session, msg, ErrorCode.MALFORMED, "field 'deadline' is set by the lobby only"
            )
        if self._parked and msg.receiver_id in self._parked and self._park(session, msg):
            return []  # behind earlier messages to the same receiver, still being looked up
        try:
            return self._handlers[msg.message_type](session, agent, msg)
        except Refusal as refusal:
            if refusal.code == ErrorCode.UNKNOWN_RECEIVER and self._park(session, msg):
                return []
            refused = self.state.error(session, msg, refusal.code, refusal.reason)
            if refusal.pause:
                refused.append(Pause(session, refusal.pause))
            return refused

    # -- REGISTER -------------------------------------------------------------------------

    def _unregistered(self, session: Session, msg: Message) -> list[Action]:
        if msg.message_type is not MessageType.REGISTER:
            return self.state.error(
                session,
                msg,
                ErrorCode.NOT_REGISTERED,
                "this connection is not registered: its first message must be REGISTER",
            )
        try:
            return self.registrar.register(session, msg)
        except Refusal as refusal:
            return self.state.error(session, msg, refusal.code, refusal.reason)

    def tick(self) -> list[Action]:
        """Time passed: end the dialogues whose deadline is gone, forget those that ended
        longer ago than the dedupe horizon, end the REQUESTs whose deadline passed; on a
        cluster node, run or close the resumes held for a failover (`failovers`). Call about
        once a second."""
        now = self.state.clock()
        self.negotiations.forget_ended(now)
        actions = self.negotiations.expire_due(now)
        actions += self.requests.deadlines.expire_due(now)
        shared = self.state.shared
        if shared is not None and shared.failing_over:
            actions += self.failovers()
        return actions

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
        return self.state.error(session, msg, ErrorCode.AUTH_FAILED, reason)

    def _unregister(self, session: Session, agent: AgentRecord, msg: Message) -> list[Action]:
        """UNREGISTER (`ToLobby.unregister`); what the agent was serving fails over."""
        actions = self.to_lobby.unregister(session, agent, msg)
        return [*actions, *self.addressed.provider_gone(agent)]


def _already_registered(session: Session, agent: AgentRecord, msg: Message) -> list[Action]:
    raise Refusal(
        ErrorCode.ALREADY_REGISTERED,
        f"this connection is already registered as {agent.agent_id!r}",
    )


def _sent_by_the_lobby_only(session: Session, agent: AgentRecord, msg: Message) -> list[Action]:
    mtype = msg.message_type
    raise Refusal(
        ErrorCode.MALFORMED,
        f"{mtype} is sent by the lobby only"
        + (
            "; answer a REQUEST with a RESPONSE whose status is 'error'"
            if mtype is MessageType.ERROR
            else ""
        ),
    )
