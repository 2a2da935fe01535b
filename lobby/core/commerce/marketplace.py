"""The marketplace: TEXT, order proposals, and payments checked against them.

`Marketplace` holds the order proposals and checks each PAYMENT against its proposal
(protocol.market); a valid payment becomes a transaction in the ledger, confirmed to both
parties. Proposals are saved whole when made or paid (`StateSaved`), so a durable lobby keeps
them across restarts.

An invalid order or payment is refused to its sender alone (`invalid_payment`); the counterpart
never sees it and no state changes.

On a cluster of lobby nodes a proposal lives on its proposer's home; a PAYMENT made on another
node is forwarded there to be checked (`Delivery.forward`).
"""

from __future__ import annotations

from typing import Any

import orjson
import structlog

from lobby.core.records import Effect, StateSaved
from lobby.core.session import Action, AgentRecord, Session
from lobby.core.state import LobbyState
from lobby.core.tracing import trace_id
from protocol.limits import clip
from protocol.market import (
    InvalidOrder,
    InvalidPayment,
    ProposalRecord,
    check_order_proposal,
    check_payment,
    decimal_text,
    transaction,
    with_text_money,
)
from protocol.models import ErrorCode, Message, MessageType

log = structlog.get_logger("lobby")


class Marketplace:
    """Owns the order proposals and the payments made against them; handles TEXT,
    ORDER_PROPOSAL and PAYMENT."""

    def __init__(self, state: LobbyState) -> None:
        self.state = state
        self.proposals: dict[str, ProposalRecord] = {}
        self.confirmations: dict[tuple[str, str], dict[str, Any]] = {}
        """(payer, payment message_id) -> its transaction: a resent PAYMENT gets it again."""
        self.traces: dict[str, str] = {}
        """Proposal message_id -> the traceparent it was forwarded with: a PAYMENT sent
        without one joins its proposal's trace. Not kept across a restart."""

    def text(self, session: Session, agent: AgentRecord, msg: Message) -> list[Action]:
        if not isinstance(msg.payload.get("content"), str):
            self.state.refuse(ErrorCode.MALFORMED, "a TEXT payload needs a string 'content'")
        return self._forward(session, msg)

    def order_proposal(self, session: Session, agent: AgentRecord, msg: Message) -> list[Action]:
        state = self.state
        try:
            order = check_order_proposal(msg.payload)
        except InvalidOrder as invalid:
            state.refuse(ErrorCode.INVALID_PAYMENT, str(invalid))
        msg.payload = with_text_money(msg.payload, order)
        target = state.receiver(msg)
        now = state.clock()
        if state.is_duplicate(msg, session, now):
            return []
        if msg.message_id is None:  # `deliver` would name it too, after this check
            msg.message_id = state.delivery.new_message_id()  # pragma: no mutate
        elif msg.message_id in self.proposals:
            # Payers name a proposal by its message_id alone: unique lobby-wide, not per sender.
            state.refuse(
                ErrorCode.INVALID_PAYMENT,
                f"message_id {clip(msg.message_id)!r} already names an order proposal; give "
                "each proposal an id of its own (rule: proposal_id_in_use)",
            )
        actions = state.deliver(target, msg, session, Effect.NONE, now)
        if msg.traceparent is not None:
            self.traces[msg.message_id] = msg.traceparent
        record = ProposalRecord(
            msg.message_id, agent.agent_id, target.agent_id, order.total_price, order.expires_at
        )
        self.proposals[record.message_id] = record
        self._save(record)
        return actions

    def payment(self, session: Session, agent: AgentRecord, msg: Message) -> list[Action]:
        state = self.state
        if msg.message_id is not None:
            original = self.confirmations.get((agent.agent_id, msg.message_id))
            if original is not None:  # a resend: the original confirmation, never a 2nd payment
                return [state.reply(session, MessageType.PAYMENT_CONFIRMED, original, msg)]
        target = state.receiver(msg)
        now = state.clock()
        proposal_id = msg.payload.get("proposal_message_id")
        proposal = self.proposals.get(proposal_id) if isinstance(proposal_id, str) else None
        if proposal is None and target.home is not None:
            # A cluster node: a proposal lives on its proposer's home, which checks every
            # payment against it, so it is paid once; this one pays a proposer on another node.
            return state.delivery.forward(target, msg, session)
        try:
            amount = check_payment(
                msg.payload,
                payer_id=agent.agent_id,
                payee_id=target.agent_id,
                proposal=proposal,
                now=now,
            )
        except InvalidPayment as invalid:
            state.refuse(ErrorCode.INVALID_PAYMENT, str(invalid))
        assert proposal is not None
        msg.payload = {**msg.payload, "amount": decimal_text(amount)}
        if msg.traceparent is None:
            msg.traceparent = self.traces.get(proposal.message_id)
        actions = state.deliver(target, msg, session, Effect.NONE, now)
        tx = transaction(
            state.ledger.new_id(),
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
        state.record(tx)
        payload = {"transaction": tx}
        self.confirmations[(agent.agent_id, str(msg.message_id))] = payload
        if state.trace:
            log.debug(
                "PAYMENT_ACCEPTED",
                payer=agent.agent_id,
                payee=target.agent_id,
                amount=tx["amount"],
                proposal_message_id=proposal.message_id,
                transaction_id=tx["transaction_id"],
                conversation_id=msg.conversation_id,
                trace_id=trace_id(msg.traceparent),
            )
        return actions + state.notify(
            (agent.agent_id, target.agent_id),
            MessageType.PAYMENT_CONFIRMED,
            payload,
            msg.conversation_id,
            now,
            msg.traceparent,
        )

    def _forward(self, session: Session, msg: Message) -> list[Action]:
        state = self.state
        target = state.receiver(msg)
        now = state.clock()
        if state.is_duplicate(msg, session, now):
            return []
        return state.deliver(target, msg, session, Effect.NONE, now)

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
        self.state.journaled(StateSaved("proposal", record.message_id, data))
