"""Delivery: per-receiver sequence numbers, mailboxes, acknowledgements, dedupe and the journal.

Pure state, no I/O. Every message the lobby accepts for a receiver goes through `Delivery.
accept()`: it gets the receiver's next `seq`, is appended to the journal (the store persists
the journal in group commits) and is either written to the receiver's connection now or held in
its mailbox. What a receiver holds:

- an agent that acknowledges (REGISTER with `"acks": true`, as the SDK does) keeps every
  message in its mailbox until it sends `ACK {"up_to": seq}`; on resume everything not yet
  acknowledged is sent again, oldest first, marked `redelivered` when it had been sent before.
- an agent that does not (a client written from seed 003 alone) counts a message as delivered
  once it is written to its connection; only messages sent while it was offline are held.

A sender that set its own `message_id` may resend it (after a reconnect, say): within the
dedupe horizon the resend is recognised, confirmed, and neither stored nor delivered again.
"""

from __future__ import annotations

import itertools
from typing import Final

from lobby.core.counters import Counters
from lobby.core.records import DELIVERED, Acked, Batch, MessageStored, Record, Snapshot
from lobby.core.refusal import Refusal
from lobby.core.registry import AgentRecord
from lobby.core.session import Action, Send, Session
from lobby.core.tracing import Tracing
from protocol.codec import encode
from protocol.models import ErrorCode, Message, MessageType

DEFAULT_DEDUPE_HORIZON: Final = 24 * 3600.0
DEFAULT_DEDUPE_MAX: Final = 500_000
_REDELIVERED: Final = b',"redelivered":true}'
_REQUEST: Final = MessageType.REQUEST
_RESPONSE: Final = MessageType.RESPONSE
RECHECKED: Final = frozenset({MessageType.REQUEST, MessageType.RESPONSE, MessageType.TEXT})
"""What the receiver's home checks again when another node forwards it (`Router.relayed`).
Everything else a node forwards it decided itself (a dialogue move, an order proposal, a
payment: their state lives on one node, `lobby.core.negotiation`), and so do the lobby's
notices: the home only stores and delivers those (`Router.decided`)."""

Forward = tuple[str, str, str, str, bytes, bool]
"""(home node, receiver, sender, message_id, frame, decided) of a message to an agent on
another node: `decided` if this node already decided it, else the home routes it as its own."""


class Delivery:
    """Owns what delivery needs across messages: per-receiver sequence numbers and mailboxes,
    the dedupe window, and the journal of records to persist with the confirmations that wait
    for its commit."""

    def __init__(
        self,
        *,
        id_prefix: str,
        mailbox_limit: int,
        dedupe_horizon: float = DEFAULT_DEDUPE_HORIZON,
        dedupe_max: int = DEFAULT_DEDUPE_MAX,
        counters: Counters | None = None,
        tracing: Tracing | None = None,
    ) -> None:
        self.counters = counters or Counters()
        """Messages accepted, by type (the router's)."""
        self.mailbox_limit = mailbox_limit
        self.dedupe_horizon = dedupe_horizon
        self.dedupe_max = dedupe_max
        self.journal: list[Record] = []
        """Records not yet handed to the store; the I/O layer takes them (`take_journal`)."""
        self.accepted: dict[Session, str] = {}
        """Per acknowledging sender, the last message_id accepted since the last commit."""
        self.forwards: list[Forward] = []
        """Cluster only: messages to agents on other nodes, for the I/O layer to forward (the
        home stamps, stores, dedupes and confirms them; the I/O layer keeps each until then, to
        resend it if the home moves)."""
        self.accepted_traces: dict[Session, str | None] = {}
        """The same, its traceparent: kept only once a traced message was accepted."""
        self.delivered: dict[str, int] = {}
        """Latest seq written to each non-acknowledging agent since the last commit."""
        self.seen: dict[tuple[str, str], float] = {}
        """(sender, sender's message_id) -> when, oldest first: the dedupe window."""
        self.last_row = 0
        self.tracing = tracing or Tracing()
        """Moves a message's traceparent on by one hop (and starts one, with trace ids on)."""
        self._start_traces = self.tracing.start_traces
        self._id_prefix = id_prefix
        self._ids = itertools.count(1)

    def new_message_id(self) -> str:
        return f"{self._id_prefix}-{next(self._ids)}"

    def is_duplicate(self, msg: Message, session: Session | None, now: float) -> bool:
        """True (and the resend confirmed, to `session` if any) if the sender already sent this
        message_id."""
        message_id = msg.message_id
        if message_id is None:
            return False
        key = (msg.sender_id, message_id)
        at = self.seen.get(key)
        if at is None or now - at > self.dedupe_horizon:
            return False
        if session is not None:
            self.confirm(session, message_id)
        return True

    def confirm(self, session: Session, message_id: str, traceparent: str | None = None) -> None:
        agent = session.agent
        if agent is not None and agent.acks:
            self.accepted[session] = message_id
            if traceparent is not None or self.accepted_traces:
                self.accepted_traces[session] = traceparent

    def accept(
        self,
        target: AgentRecord,
        msg: Message,
        sender: Session | None,
        effect: int,
        now: float,
        force: bool = False,
    ) -> list[Action]:
        """Stamp, journal and deliver (or hold) `msg` for `target`; a full mailbox refuses it
        (`mailbox_full`) with nothing changed, unless `force`: the lobby's own notices are never
        refused. The sender's token never leaves: it is dropped here."""
        if target.home is not None:
            return self.forward(target, msg, sender, msg.message_type not in RECHECKED)
        if len(target.mailbox) >= self.mailbox_limit and not force:
            raise Refusal(
                ErrorCode.MAILBOX_FULL,
                f"agent {target.agent_id!r} already holds {self.mailbox_limit} undelivered "
                "messages",
            )
        seq = target.next_seq = target.next_seq + 1
        mtype = msg.message_type
        if mtype is _REQUEST:
            self.counters.requests += 1
        elif mtype is _RESPONSE:
            self.counters.responses += 1
        else:
            self.counters.routed[mtype] += 1
        sender_set_id = msg.message_id
        if sender_set_id is None:
            msg.message_id = self.new_message_id()
        if msg.traceparent is not None or self._start_traces:
            msg.traceparent = self.tracing.hop(msg, target.agent_id)
        msg.seq = seq
        msg.auth_token = None
        msg.redelivered = None
        frame = encode(msg)
        session = target.session
        self.last_row += 1
        self.journal.append(
            MessageStored(
                self.last_row,
                target.agent_id,
                seq,
                msg.sender_id,
                msg.message_id,  # type: ignore[arg-type]  # set just above
                msg.conversation_id,
                effect,
                DELIVERED if session is not None and not target.acks else frame,
                now,
            )
        )
        if sender is not None:
            if sender_set_id is not None:
                self.seen[(msg.sender_id, sender_set_id)] = now
            self.confirm(sender, msg.message_id, msg.traceparent)  # type: ignore[arg-type]
        if target.acks or session is None:
            target.mailbox.append((seq, frame))
        if session is None:
            return []
        target.delivered_seq = seq
        if not target.acks:
            # Written to its connection = delivered, for an agent that does not acknowledge.
            # Coalesced: one Acked record per agent per commit, not one per message.
            self.delivered[target.agent_id] = target.acked_seq = seq
        return [Send(session, frame)]

    def forward(
        self, target: AgentRecord, msg: Message, sender: Session | None, decided: bool = False
    ) -> list[Action]:
        """Cluster only: `target`'s connection is on another node, its home. `decided`: this
        node decided `msg` (or it is a lobby notice, `sender` None), and the home only stores
        and delivers it; else the home routes it as its own (checks, stamps, stores, confirms)."""
        msg.auth_token = None
        message_id = msg.message_id
        if message_id is None:
            # Named here, so the home's dedupe absorbs a resend of it after a failover.
            message_id = msg.message_id = self.new_message_id()
        home: str = target.home  # type: ignore[assignment]  # not None: checked by the caller
        self.forwards.append(
            (
                home,
                target.agent_id,
                msg.sender_id,
                message_id,
                encode(msg),
                decided or sender is None,
            )
        )
        return []

    def acknowledge(self, agent: AgentRecord, up_to: int) -> None:
        """`agent` processed every message up to `up_to`: forget them."""
        up_to = min(up_to, agent.next_seq)
        if up_to <= agent.acked_seq:
            return
        agent.acked_seq = up_to
        mailbox = agent.mailbox
        while mailbox and mailbox[0][0] <= up_to:
            mailbox.popleft()
        self.journal.append(Acked(agent.agent_id, up_to))

    def replay(self, agent: AgentRecord, session: Session) -> list[Action]:
        """On resume: everything held, oldest first; what was sent before is marked so."""
        actions: list[Action] = []
        for seq, frame in agent.mailbox:
            if seq <= agent.delivered_seq:
                frame = frame[:-1] + _REDELIVERED
            actions.append(Send(session, frame))
        if agent.mailbox:
            last = agent.mailbox[-1][0]
            agent.delivered_seq = last
            if not agent.acks:
                agent.mailbox.clear()
                self.journal.append(Acked(agent.agent_id, last))
                agent.acked_seq = last
        return actions

    @property
    def pending(self) -> bool:
        """Whether records or confirmations wait for a commit."""
        return bool(self.journal or self.accepted)

    def take_journal(self) -> Batch:
        """Hand the pending records and confirmations over (one group commit)."""
        journal, accepted, traces = self.journal, self.accepted, self.accepted_traces
        if self.delivered:
            journal.extend(Acked(agent_id, seq) for agent_id, seq in self.delivered.items())
            self.delivered = {}
        self.journal, self.accepted = [], {}
        if traces:
            self.accepted_traces = {}
        return Batch(journal, accepted, traces)

    def forget_old(self, now: float) -> None:
        """Drop dedupe entries past the horizon or beyond the size cap, oldest first."""
        seen = self.seen
        cutoff = now - self.dedupe_horizon
        excess = len(seen) - self.dedupe_max
        for key, at in list(itertools.islice(seen.items(), max(excess, 0) + 10_000)):
            if excess <= 0 and at >= cutoff:
                break  # pragma: no mutate (`return` is the same: nothing follows the loop)
            del seen[key]
            excess -= 1

    def restore(self, snapshot: Snapshot, agents: dict[str, AgentRecord]) -> None:
        """Rebuild mailboxes, sequence numbers and the dedupe window from `snapshot` (the open
        conversations are `Conversations.restore`'s)."""
        for agent_id, up_to in snapshot.acked.items():
            agent = agents.get(agent_id)
            if agent is not None:
                agent.acked_seq = agent.next_seq = agent.delivered_seq = up_to
        # Row ids given from here on must stay above the checkpoint's, even when the newest
        # rows were dropped (a removed agent's).
        self.last_row = max(self.last_row, snapshot.conversations_upto)
        for row in snapshot.messages:
            self.last_row = max(self.last_row, row.row_id)
            self.seen[(row.sender, row.message_id)] = row.at
            agent = agents.get(row.receiver)
            if agent is None:
                continue
            agent.next_seq = max(agent.next_seq, row.seq)
            if row.seq > agent.acked_seq:
                agent.mailbox.append((row.seq, row.frame))
                # It may have reached the agent before the restart: mark it redelivered.
                agent.delivered_seq = max(agent.delivered_seq, row.seq)
