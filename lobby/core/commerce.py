"""Negotiation and marketplace moves, checked by the lobby before anything is forwarded.

`Negotiations` holds every FIPA dialogue (protocol.fipa decides legality; this module applies
it, forwards legal moves, ends expired dialogues and, as the TAC controller, records a matched
trade and confirms it to both parties). `Marketplace` holds order proposals and checks payments
against them (protocol.market). Both write the ledger, and save what changed through the
journal as `StateSaved` records, so a durable lobby keeps them across restarts.

An illegal move or payment is refused to its sender alone (`invalid_dialogue`,
`invalid_payment`); the counterpart never sees it and no state changes.
"""

from __future__ import annotations

import heapq
import itertools
import uuid
from typing import TYPE_CHECKING, Any

import orjson

from lobby.core.delivery import DEFAULT_DEDUPE_HORIZON
from lobby.core.records import Effect, StateRemoved, StateSaved
from lobby.core.registry import AgentRecord
from lobby.core.session import Action, Session
from protocol.fipa import Dialogue, IllegalMove
from protocol.market import (
    InvalidOrder,
    InvalidPayment,
    ProposalRecord,
    check_order_proposal,
    check_payment,
    transaction,
)
from protocol.models import ErrorCode, Message, MessageType

if TYPE_CHECKING:
    from lobby.core.router import Router

DEFAULT_DIALOGUE_TIMEOUT = 3600.0


class Ledger:
    """Every transaction, in order, findable by party."""

    def __init__(self) -> None:
        self.transactions: list[dict[str, Any]] = []
        self._ids = itertools.count(1)
        self._prefix = uuid.uuid4().hex[:8]

    def new_id(self) -> str:
        return f"tx-{self._prefix}-{next(self._ids)}"

    def of(self, agent_id: str) -> list[dict[str, Any]]:
        return [t for t in self.transactions if agent_id in (t["buyer"], t["seller"])]


class Negotiations:
    def __init__(
        self,
        router: Router,
        *,
        timeout: float = DEFAULT_DIALOGUE_TIMEOUT,
        remember: float = DEFAULT_DEDUPE_HORIZON,
    ) -> None:
        self.router = router
        self.timeout = timeout
        self.remember = remember
        """Seconds an ended dialogue is kept (its conversation_id cannot start another one
        meanwhile); then it is forgotten, so ended dialogues do not pile up forever."""
        self.dialogues: dict[str, Dialogue] = {}
        self.open: dict[str, Dialogue] = {}
        self.ended: dict[str, float] = {}
        """Ended dialogues -> when they ended, oldest first."""
        self.started: dict[str, int] = {}
        """Per agent, the open dialogues it started (bounded by `max_open_dialogues`)."""
        self._due: list[tuple[float, str]] = []
        """A heap of (when it expires, dialogue id), one entry per open dialogue, so a tick
        looks at the earliest only. A move only ever puts a dialogue's expiry later: its entry
        is moved on when it comes due, not at every move."""

    def move(self, session: Session, agent: AgentRecord, msg: Message) -> list[Action]:
        router = self.router
        dialogue_id = msg.conversation_id
        if dialogue_id is None:
            router.refuse(ErrorCode.MALFORMED, f"a {msg.message_type} needs a conversation_id")
        target = router.receiver(msg)
        now = router.clock()
        if router.delivery.is_duplicate(msg, session, now):
            return []
        if msg.message_id is None:
            msg.message_id = router.delivery.new_message_id()
        dialogue = self.dialogues.get(dialogue_id)
        limit = router.limits.max_open_dialogues
        if dialogue is None and limit and self.started.get(agent.agent_id, 0) >= limit:
            router.refuse(
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
            router.refuse(ErrorCode.INVALID_DIALOGUE, str(illegal))
        move_id, in_reply_to, payload = msg.message_id, msg.in_reply_to, msg.payload
        actions = router.deliver(target, msg, session, Effect.NONE, now)
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
        router = self.router
        tx = transaction(
            router.ledger.new_id(),
            kind="negotiation",
            buyer=terms.buyer,
            seller=terms.seller,
            amount=terms.price,
            goods=terms.goods,
            reference=dialogue.dialogue_id,
            now=now,
        )
        dialogue.transaction_id = tx["transaction_id"]
        router.record(tx)
        payload = {"transaction": tx}
        return router.notify(
            (dialogue.initiator, dialogue.responder),
            MessageType.TRANSACTION_CONFIRMED,
            payload,
            dialogue.dialogue_id,
            now,
        )

    def expire_due(self, now: float) -> list[Action]:
        """End dialogues whose CFP deadline passed unanswered or that idled too long."""
        actions: list[Action] = []
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
            actions += self.router.notify(
                (dialogue.initiator, dialogue.responder),
                MessageType.DIALOGUE_EXPIRED,
                {"dialogue_id": dialogue.dialogue_id, "reason": reason},
                dialogue.dialogue_id,
                now,
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

    def _expiry(self, dialogue: Dialogue) -> float:
        """When `dialogue` expires unless a move comes first."""
        idle = dialogue.updated_at + self.timeout
        return idle if dialogue.reply_by is None else min(idle, dialogue.reply_by)

    def _schedule(self, dialogue: Dialogue) -> None:
        heapq.heappush(self._due, (self._expiry(dialogue), dialogue.dialogue_id))

    def forget_ended(self, now: float) -> None:
        """Forget the dialogues that ended more than `remember` seconds ago."""
        ended, cutoff = self.ended, now - self.remember
        while ended:
            dialogue_id, at = next(iter(ended.items()))
            if at >= cutoff:
                break
            del ended[dialogue_id]
            self.dialogues.pop(dialogue_id, None)
            self.router.delivery.journal.append(StateRemoved("dialogue", dialogue_id))

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
        self.router.delivery.journal.append(StateSaved("dialogue", dialogue.dialogue_id, data))


class Marketplace:
    def __init__(self, router: Router) -> None:
        self.router = router
        self.proposals: dict[str, ProposalRecord] = {}
        self.confirmations: dict[tuple[str, str], dict[str, Any]] = {}
        """(payer, payment message_id) -> its transaction: a resent PAYMENT gets it again."""

    def text(self, session: Session, agent: AgentRecord, msg: Message) -> list[Action]:
        if not isinstance(msg.payload.get("content"), str):
            self.router.refuse(ErrorCode.MALFORMED, "a TEXT payload needs a string 'content'")
        return self._forward(session, msg)

    def order_proposal(self, session: Session, agent: AgentRecord, msg: Message) -> list[Action]:
        router = self.router
        try:
            order = check_order_proposal(msg.payload)
        except InvalidOrder as invalid:
            router.refuse(ErrorCode.INVALID_PAYMENT, str(invalid))
        target = router.receiver(msg)
        now = router.clock()
        if router.delivery.is_duplicate(msg, session, now):
            return []
        if msg.message_id is None:
            msg.message_id = router.delivery.new_message_id()
        elif msg.message_id in self.proposals:
            router.refuse(ErrorCode.INVALID_PAYMENT, "that message_id already names a proposal")
        actions = router.deliver(target, msg, session, Effect.NONE, now)
        record = ProposalRecord(
            msg.message_id, agent.agent_id, target.agent_id, order.total_price, order.expires_at
        )
        self.proposals[record.message_id] = record
        self._save(record)
        return actions

    def payment(self, session: Session, agent: AgentRecord, msg: Message) -> list[Action]:
        router = self.router
        if msg.message_id is not None:
            original = self.confirmations.get((agent.agent_id, msg.message_id))
            if original is not None:  # a resend: the original confirmation, never a 2nd payment
                return [router.reply(session, MessageType.PAYMENT_CONFIRMED, original, msg)]
        target = router.receiver(msg)
        now = router.clock()
        proposal_id = msg.payload.get("proposal_message_id")
        proposal = self.proposals.get(proposal_id) if isinstance(proposal_id, str) else None
        try:
            amount = check_payment(
                msg.payload,
                payer_id=agent.agent_id,
                payee_id=target.agent_id,
                proposal=proposal,
                now=now,
            )
        except InvalidPayment as invalid:
            router.refuse(ErrorCode.INVALID_PAYMENT, str(invalid))
        assert proposal is not None
        actions = router.deliver(target, msg, session, Effect.NONE, now)
        tx = transaction(
            router.ledger.new_id(),
            kind="payment",
            buyer=agent.agent_id,
            seller=target.agent_id,
            amount=amount,
            goods=None,
            reference=proposal.message_id,
            now=now,
        )
        proposal.paid_by = msg.message_id
        proposal.transaction_id = tx["transaction_id"]
        self._save(proposal)
        router.record(tx)
        payload = {"transaction": tx}
        self.confirmations[(agent.agent_id, str(msg.message_id))] = payload
        return actions + router.notify(
            (agent.agent_id, target.agent_id),
            MessageType.PAYMENT_CONFIRMED,
            payload,
            msg.conversation_id,
            now,
        )

    def _forward(self, session: Session, msg: Message) -> list[Action]:
        router = self.router
        target = router.receiver(msg)
        now = router.clock()
        if router.delivery.is_duplicate(msg, session, now):
            return []
        return router.deliver(target, msg, session, Effect.NONE, now)

    def restore(self, proposals: list[bytes], transactions: list[dict[str, Any]]) -> None:
        for document in proposals:
            record = ProposalRecord.from_dict(orjson.loads(document))
            self.proposals[record.message_id] = record
        by_id = {t["transaction_id"]: t for t in transactions}
        for record in self.proposals.values():
            if record.paid_by is not None and record.transaction_id in by_id:
                key = (record.receiver_id, record.paid_by)
                self.confirmations[key] = {"transaction": by_id[record.transaction_id]}

    def _save(self, record: ProposalRecord) -> None:
        data = orjson.dumps(record.to_dict())
        self.router.delivery.journal.append(StateSaved("proposal", record.message_id, data))
