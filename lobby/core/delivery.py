"""Delivery: per-receiver sequence numbers, mailboxes, acknowledgements, dedupe and the journal.

Pure state, no I/O. Every message the lobby accepts for a receiver goes through `Delivery.
accept()`: it gets the receiver's next `seq`, is appended to the journal (the store persists
the journal in group commits) and is either written to the receiver's connection now or held in
its mailbox. What a receiver holds:

- an agent that acknowledges (REGISTER with `"acks": true`, as the SDK does) keeps every
  message in its mailbox until it sends `ACK {"up_to": seq}`; on resume everything not yet
  acknowledged is sent again, oldest first, marked `redelivered` when it had been sent before.
- an agent that does not (a client written from seed 003 alone) counts a message as delivered
  once it is written to its connection; only messages sent while it was offline, or while its
  connection was past the delivery window, are held.

Delivery is paced by the reader: the lobby writes to a connection only while its outbound queue
is within the delivery window (`window` bytes). The I/O layer, which alone sees the queue, sets
`AgentRecord.paced` when a flush leaves it past the window; from then on what is accepted for
the agent is held in its mailbox, as if it were offline, and `release` writes it, oldest first,
once the queue has drained. A resume replays its backlog the same way, a window at a time, so a
reader of any speed drains any backlog; a live message never overtakes a held one.

A sender that set its own `message_id` may resend it (after a reconnect, say): within the
dedupe horizon the resend is recognised, confirmed, and neither stored nor delivered again.
"""

from __future__ import annotations

import itertools
from bisect import bisect_right
from collections import deque
from typing import Final

from lobby.core.accepting import Unsettled
from lobby.core.counters import Counters
from lobby.core.records import (
    DEFAULT_DEDUPE_MAX,
    DELIVERED,
    Acked,
    Batch,
    Effect,
    MessageStored,
    Record,
    Snapshot,
)
from lobby.core.refusal import Refusal
from lobby.core.session import NO_MAIL, Action, AgentRecord, Send, Session
from lobby.core.tracing import Tracing
from protocol.codec import encode
from protocol.models import ErrorCode, Message, MessageType

DEFAULT_DEDUPE_HORIZON: Final = 24 * 3600.0
DEFAULT_DELIVERY_WINDOW: Final = 1024 * 1024
_REDELIVERED: Final = b',"redelivered":true}'
_REQUEST: Final = MessageType.REQUEST
_RESPONSE: Final = MessageType.RESPONSE
_ENDS: Final = Effect.ENDS
RECHECKED: Final = frozenset({MessageType.REQUEST, MessageType.RESPONSE, MessageType.TEXT})
"""What the receiver's home checks again when another node forwards it (`Router.relayed`).
Everything else a node forwards it decided itself (a dialogue move, an order proposal, a
payment: their state lives on one node, `lobby.core.commerce.negotiation`), and so do the lobby's
notices: the home only stores and delivers those (`Router.decided`)."""


def _seq(held: tuple[int, bytes]) -> int:
    return held[0]


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
        window: int = DEFAULT_DELIVERY_WINDOW,
        counters: Counters | None = None,
        tracing: Tracing | None = None,
    ) -> None:
        self.counters = counters or Counters()
        """Messages accepted, by type (the router's)."""
        self.mailbox_limit = mailbox_limit
        self.dedupe_horizon = dedupe_horizon
        self.dedupe_max = dedupe_max
        self.window = window
        """Bytes a resume writes of its backlog at once (the I/O layer writes the rest as the
        connection's queue drains, `release`)."""
        self.paced: dict[Session, AgentRecord] = {}
        """Connected agents the I/O layer is to look at after this batch: a message was held
        for one (is its queue plus what is held past `--max-outbound-bytes`?), or one resumed
        with more held than a window (write more as its queue allows)."""
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
            if session.unsettled is not None:
                session.unsettled.here(message_id)
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
        held = session is None or target.paced
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
                # A deadline's REQUEST and the lobby's answer ending one are read at restore.
                frame if held or target.acks or effect == _ENDS or msg.deadline else DELIVERED,
                now,
            )
        )
        if sender is not None:
            if sender_set_id is not None:
                self.seen[(msg.sender_id, sender_set_id)] = now
            self.confirm(sender, msg.message_id, msg.traceparent)  # type: ignore[arg-type]
        if held:
            # Offline, or its queue is past the window: written when it resumes or drains.
            target.hold(seq, frame)
            if session is not None:
                target.held_bytes += len(frame)
                self.paced[session] = target
            return []
        if target.acks:
            mailbox = target.mailbox
            if mailbox is NO_MAIL:  # inline `hold`: every message to an acking agent
                mailbox = target.mailbox = deque()
            mailbox.append((seq, frame))
        target.delivered_seq = seq
        if not target.acks:
            # Written to its connection = delivered, for an agent that does not acknowledge.
            # Coalesced: one Acked record per agent per commit, not one per message.
            self.delivered[target.agent_id] = target.acked_seq = seq
        return [Send(session, frame)]  # type: ignore[arg-type]  # not None: not held

    def forward(
        self, target: AgentRecord, msg: Message, sender: Session | None, decided: bool = False
    ) -> list[Action]:
        """Cluster only: `target`'s connection is on another node, its home. `decided`: this
        node decided `msg` (or it is a lobby notice, `sender` None), and the home only stores
        and delivers it; else the home routes it as its own (checks, stamps, stores, confirms)."""
        msg.auth_token = None
        message_id = msg.message_id
        agent = sender.agent if sender is not None else None
        if message_id is None:
            # Named here, so the home's dedupe absorbs a resend of it after a failover.
            message_id = msg.message_id = self.new_message_id()
        elif agent is not None and agent.acks and agent.session is sender and agent.home is None:
            # Its sender is connected here (not a relay session), and can resend it: its
            # ACCEPTEDs wait for this message's home to store it (`lobby.core.accepting`).
            self._unsettled(sender).away(message_id)  # type: ignore[arg-type]  # not None
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

    def _unsettled(self, session: Session) -> Unsettled:
        unsettled = session.unsettled
        if unsettled is None:
            unsettled = session.unsettled = Unsettled()
            pending = self.accepted.get(session)
            if pending is not None:  # journaled here before it, not yet taken: comes first
                unsettled.here(pending)
        return unsettled

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
        if up_to > agent.delivered_seq:
            # Acknowledged before it was written (the agent read it with FETCH_MESSAGES, or
            # acknowledged ahead): not to be written now, nor counted as held.
            agent.delivered_seq = up_to
            after = max(up_to, agent.resumed_seq)
            agent.held_bytes = sum(len(frame) for seq, frame in mailbox if seq > after)

    def replay(self, agent: AgentRecord, session: Session) -> list[Send]:
        """On resume: what is held, oldest first, a window of it at once (`release` writes the
        rest as the connection drains); what an earlier connection got is marked redelivered."""
        mailbox = agent.mailbox
        agent.redeliver_upto = max(agent.redeliver_upto, agent.delivered_seq)
        agent.delivered_seq = mailbox[0][0] - 1 if mailbox else agent.next_seq
        agent.resumed_seq = agent.next_seq
        agent.held_bytes = 0
        agent.paced = bool(mailbox)
        if not mailbox:
            return []
        actions = self.release(agent, self.window)
        if agent.paced:
            self.paced[session] = agent
        return actions

    def release(self, agent: AgentRecord, room: int) -> list[Send]:
        """Write `agent`'s held messages to its connection, oldest first, until `room` bytes
        are written (at least one message); once none is left, it is no longer paced. Call
        when its connection's queue has `room` bytes left under the window."""
        session = agent.session
        if session is None:
            return []
        mailbox = agent.mailbox
        start = bisect_right(mailbox, agent.delivered_seq, key=_seq)
        resumed, redelivered = agent.resumed_seq, agent.redeliver_upto
        actions: list[Send] = []
        written = 0
        for seq, frame in itertools.islice(mailbox, start, None):
            if written >= room and actions:
                break
            written += len(frame)
            if seq > resumed:
                agent.held_bytes -= len(frame)
            if seq <= redelivered:
                frame = frame[:-1] + _REDELIVERED
            actions.append(Send(session, frame))
            agent.delivered_seq = seq
        else:
            agent.paced = False
        if actions and not agent.acks:
            # Written = delivered, for an agent that does not acknowledge.
            for _ in actions:
                mailbox.popleft()
            self.delivered[agent.agent_id] = agent.acked_seq = agent.delivered_seq
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
        for session in accepted:
            if session.unsettled is not None:
                session.unsettled.take()
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
                agent.hold(row.seq, row.frame)
                # It may have reached the agent before the restart: mark it redelivered.
                agent.delivered_seq = max(agent.delivered_seq, row.seq)
