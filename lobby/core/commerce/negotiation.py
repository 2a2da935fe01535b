"""Negotiation: FIPA dialogues, checked by the lobby before any move is forwarded.

`Negotiations` holds every dialogue (protocol.fipa decides legality; this module applies it,
forwards legal moves, ends expired dialogues and, as the TAC controller, records a matched trade
in the ledger and confirms it to both parties). Each dialogue is saved whole after every move
(`StateSaved`), so a durable lobby keeps them across restarts.

An illegal move is refused to its sender alone (`invalid_dialogue`); the counterpart never sees
it and no state changes.

On a cluster of lobby nodes a dialogue lives on one node, its initiator's home when its CFP
was sent: that node decides every move, keeps the dialogue's deadline and records its trade.
A move its responder makes on another node is forwarded there to be decided; a move decided
there, and its notices, reach a party on another node already decided (`Router.decided`).
"""

from __future__ import annotations

import heapq

import orjson
import structlog

from lobby.core.commerce.sealed import UNREVEALED, SealedRounds
from lobby.core.delivery import DEFAULT_DEDUPE_HORIZON
from lobby.core.records import Effect, StateRemoved, StateSaved
from lobby.core.session import Action, AgentRecord, Session
from lobby.core.state import LobbyState
from lobby.core.tracing import trace_id
from protocol.fipa import Dialogue, IllegalMove
from protocol.market import transaction
from protocol.models import LOBBY_ID, ErrorCode, Message, MessageType

DEFAULT_DIALOGUE_TIMEOUT = 3600.0
_CFP = MessageType.CFP

log = structlog.get_logger("lobby")


class Negotiations:
    """Owns every FIPA dialogue (open, ended, and when each expires); handles CFP, PROPOSE,
    ACCEPT, DECLINE and MATCH_ACCEPT, and settles a matched dialogue as a transaction."""

    def __init__(
        self,
        state: LobbyState,
        *,
        timeout: float = DEFAULT_DIALOGUE_TIMEOUT,
        remember: float = DEFAULT_DEDUPE_HORIZON,
    ) -> None:
        self.state = state
        self.timeout = timeout
        self.remember = remember
        """Seconds an ended dialogue is kept (its conversation_id cannot start another one
        meanwhile); then it is forgotten, so ended dialogues do not pile up forever."""
        self.dialogues: dict[str, Dialogue] = {}
        self.open: dict[str, Dialogue] = {}
        self.ended: dict[str, float] = {}
        """Ended dialogues -> when they ended, oldest first."""
        self.traces: dict[str, str] = {}
        """Dialogue id -> the traceparent of its first traced move: a move sent without one,
        and the lobby's notices about the dialogue, join that trace."""
        self.started: dict[str, int] = {}
        """Per agent, the open dialogues it started (bounded by `max_open_dialogues`)."""
        self._due: list[tuple[float, str]] = []
        """A heap of (when it expires, dialogue id), one entry per open dialogue, so a tick
        looks at the earliest only. A move only ever puts a dialogue's expiry later: its entry
        is moved on when it comes due, not at every move."""
        self.sealed = SealedRounds(self)

    def move(self, session: Session, agent: AgentRecord, msg: Message) -> list[Action]:
        state = self.state
        dialogue_id = msg.conversation_id
        if dialogue_id is None:
            state.refuse(ErrorCode.MALFORMED, f"a {msg.message_type} needs a conversation_id")
        sealed_round = msg.receiver_id == LOBBY_ID and msg.message_type is MessageType.CFP
        target = None if sealed_round else state.receiver(msg)
        now = state.clock()
        if state.is_duplicate(msg, session, now):
            return []
        if msg.message_id is None:
            msg.message_id = state.delivery.new_message_id()
        if target is None:
            return self.sealed.cfp(session, agent, msg, now)
        dialogue = self.dialogues.get(dialogue_id)
        if dialogue is None and target.home is not None and msg.message_type is not _CFP:
            # A cluster node: a dialogue lives on its initiator's home, which decides every
            # move in it; this one answers that initiator, on another node.
            return state.delivery.forward(target, msg, session)
        if dialogue is not None and dialogue.sealed_by is not None and dialogue.state in UNREVEALED:
            return self.sealed.answer(session, agent, msg, dialogue, now)
        limit = state.limits.max_open_dialogues
        starts = dialogue is None and msg.message_type is _CFP  # else refused `not_a_party`
        if starts and limit and self.started.get(agent.agent_id, 0) >= limit:
            state.refuse(
                ErrorCode.LIMIT_EXCEEDED,
                f"agent {agent.agent_id!r} already has {limit} open dialogues it started; "
                "this CFP was not routed",
            )
        try:
            if dialogue is None:
                dialogue = Dialogue.start(
                    dialogue_id,
                    agent.agent_id,
                    target.agent_id,
                    msg.message_id,
                    msg.message_type,
                    msg.in_reply_to,
                    msg.payload,
                    now,
                )
                started = True
            else:
                dialogue.check(
                    agent.agent_id, target.agent_id, msg.message_type, msg.in_reply_to, msg.payload
                )
                started = False
        except IllegalMove as illegal:
            state.refuse(ErrorCode.INVALID_DIALOGUE, str(illegal))
        move_id, in_reply_to, payload = msg.message_id, msg.in_reply_to, msg.payload
        before = None if started else dialogue.state
        traces = self.traces
        if msg.traceparent is None:
            msg.traceparent = traces.get(dialogue_id)
        actions = state.deliver(target, msg, session, Effect.NONE, now)
        if msg.traceparent is not None and dialogue_id not in traces:
            traces[dialogue_id] = msg.traceparent
        if started:
            self.dialogues[dialogue_id] = self.open[dialogue_id] = dialogue
            self.started[agent.agent_id] = self.started.get(agent.agent_id, 0) + 1
            self._schedule(dialogue)
        else:
            dialogue.apply(
                agent.agent_id,
                target.agent_id,
                move_id,
                msg.message_type,
                in_reply_to,
                payload,
                now,
            )
        if state.trace:
            log.debug(
                "DIALOGUE_MOVE",
                dialogue_id=dialogue_id,
                move=msg.message_type,
                sender=agent.agent_id,
                receiver=target.agent_id,
                state_before=before,
                state_after=dialogue.state,
                trace_id=trace_id(msg.traceparent),
            )
        if dialogue.is_over:
            self._ended(dialogue)
            actions += self._settle(dialogue, now)
        self._save(dialogue)
        return actions

    def _settle(self, dialogue: Dialogue, now: float) -> list[Action]:
        """The TAC controller: a matched dialogue with a price becomes a confirmed trade."""
        terms = dialogue.terms()
        if terms is None:
            return []
        state = self.state
        tx = transaction(
            state.ledger.new_id(),
            kind="negotiation",
            buyer=terms.buyer,
            seller=terms.seller,
            amount=terms.price,
            goods=terms.goods,
            reference=dialogue.dialogue_id,
            now=now,
        )
        dialogue.transaction_id = tx["transaction_id"]
        state.record(tx)
        payload = {"transaction": tx}
        return state.notify(
            (dialogue.initiator, dialogue.responder),
            MessageType.TRANSACTION_CONFIRMED,
            payload,
            dialogue.dialogue_id,
            now,
            self.traces.get(dialogue.dialogue_id),
        )

    def expire_due(self, now: float) -> list[Action]:
        """Reveal the sealed rounds whose deadline passed; end dialogues whose CFP deadline
        passed unanswered or that idled too long."""
        actions = self.sealed.reveal_due(now)
        due = self._due
        while due and due[0][0] < now:
            at, dialogue_id = heapq.heappop(due)
            dialogue = self.open.get(dialogue_id)
            if dialogue is None:
                continue  # it ended
            expiry = self._expiry(dialogue)
            if expiry > at:  # moves came since: not yet
                heapq.heappush(due, (expiry, dialogue_id))
                continue
            if dialogue.reply_by is not None and now > dialogue.reply_by:
                reason = "the CFP's reply_by passed with no reply"
            else:
                reason = f"no move for {self.timeout:g} s"
            dialogue.expire(now)
            self._ended(dialogue)
            self._save(dialogue)
            actions += self.state.notify(
                (dialogue.initiator, dialogue.responder),
                MessageType.DIALOGUE_EXPIRED,
                {"dialogue_id": dialogue.dialogue_id, "reason": reason},
                dialogue.dialogue_id,
                now,
                self.traces.get(dialogue.dialogue_id),
            )
        return actions

    def restore(self, documents: list[bytes]) -> None:
        for document in documents:
            dialogue = Dialogue.from_dict(orjson.loads(document))
            self.dialogues[dialogue.dialogue_id] = dialogue
            if dialogue.is_over:
                self.ended[dialogue.dialogue_id] = dialogue.updated_at
            else:
                self.open[dialogue.dialogue_id] = dialogue
                self.started[dialogue.initiator] = self.started.get(dialogue.initiator, 0) + 1
                self._schedule(dialogue)
        # Saved in the order they started; `forget_ended` wants them in the order they ended.
        self.ended = dict(sorted(self.ended.items(), key=lambda item: item[1]))

    def restore_rounds(self, documents: list[bytes]) -> None:
        """Load the saved sealed rounds; call after `restore`."""
        self.sealed.restore(documents)

    def _expiry(self, dialogue: Dialogue) -> float:
        """When `dialogue` expires unless a move comes first."""
        idle = dialogue.updated_at + self.timeout
        if dialogue.sealed_by is not None:  # never idle out before its round is revealed
            idle = max(idle, dialogue.sealed_by + self.timeout)
        return idle if dialogue.reply_by is None else min(idle, dialogue.reply_by)

    def opened(self, dialogue: Dialogue) -> None:
        """Track a dialogue a sealed round started."""
        self.dialogues[dialogue.dialogue_id] = self.open[dialogue.dialogue_id] = dialogue
        self.started[dialogue.initiator] = self.started.get(dialogue.initiator, 0) + 1
        self._schedule(dialogue)
        self._save(dialogue)

    def _schedule(self, dialogue: Dialogue) -> None:
        heapq.heappush(self._due, (self._expiry(dialogue), dialogue.dialogue_id))

    def forget_ended(self, now: float) -> None:
        """Forget the dialogues that ended more than `remember` seconds ago."""
        ended, cutoff = self.ended, now - self.remember
        self.sealed.forget(cutoff)
        while ended:
            dialogue_id, at = next(iter(ended.items()))
            if at >= cutoff:
                break  # pragma: no mutate
            del ended[dialogue_id]
            self.dialogues.pop(dialogue_id, None)
            self.traces.pop(dialogue_id, None)
            self.state.journaled(StateRemoved("dialogue", dialogue_id))

    def finish(self, dialogue: Dialogue) -> None:
        """Bookkeeping for a dialogue that is over: no longer open, forgotten in time."""
        self._ended(dialogue)

    def give_up(self, dialogue: Dialogue) -> None:
        """Forget `dialogue` here, open or not: another node decides it from now on (its
        initiator resumed there, `lobby.core.cluster.handover`)."""
        dialogue_id = dialogue.dialogue_id
        self._ended(dialogue)
        del self.ended[dialogue_id]
        self.dialogues.pop(dialogue_id, None)
        self.traces.pop(dialogue_id, None)

    def save(self, dialogue: Dialogue) -> None:
        """Journal `dialogue` whole (after any change)."""
        self._save(dialogue)

    def _ended(self, dialogue: Dialogue) -> None:
        self.ended[dialogue.dialogue_id] = dialogue.updated_at
        if self.open.pop(dialogue.dialogue_id, None) is not None:
            count = self.started.get(dialogue.initiator, 0) - 1
            if count > 0:
                self.started[dialogue.initiator] = count
            else:
                self.started.pop(dialogue.initiator, None)

    def _save(self, dialogue: Dialogue) -> None:
        data = orjson.dumps(dialogue.to_dict())
        self.state.journaled(StateSaved("dialogue", dialogue.dialogue_id, data))
