"""The marketplace for agents: text, order proposals, payments checked by the lobby, and the
mailbox pull."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from decimal import Decimal
from typing import Any

import orjson
from pydantic import BaseModel

from agent_sdk.caller import Caller
from protocol.codec import decode
from protocol.market import money, money_text
from protocol.models import Message, MessageType
from protocol.payloads import OrderItemModel


class Order(BaseModel):
    """An order proposal as sent: its message id (what a PAYMENT names) and its total."""

    message_id: str
    customer: str
    items: list[OrderItemModel]
    total_price: str


class Trader(Caller):
    """Marketplace messages and their callbacks; mixed into `Agent`. The routes of TEXT,
    ORDER_PROPOSAL, PAYMENT and PAYMENT_CONFIRMED (a payment nobody awaits)."""

    def __init__(self, agent_id: str | None = None, **options: Any) -> None:
        super().__init__(agent_id, **options)
        self._routes.update(
            {
                MessageType.TEXT: lambda m: self.on_text(m, str(m.payload.get("content", ""))),
                MessageType.ORDER_PROPOSAL: lambda m: self.on_order_proposal(m, m.payload),
                MessageType.PAYMENT: lambda m: self.on_payment(m, m.payload),
                MessageType.PAYMENT_CONFIRMED: lambda m: self.on_payment_confirmed(
                    m.payload.get("transaction", {})
                ),
            }
        )

    # -- callbacks (override) -------------------------------------------------------------

    async def on_text(self, message: Message, content: str) -> None:
        """A TEXT message arrived."""

    async def on_order_proposal(self, message: Message, proposal: dict[str, Any]) -> None:
        """A business proposed an order; pay it with `pay(message)`."""

    async def on_payment(self, message: Message, payment: dict[str, Any]) -> None:
        """A customer paid one of this agent's proposals (the lobby checked it)."""

    async def on_payment_confirmed(self, transaction: dict[str, Any]) -> None:
        """The lobby recorded a payment this agent is party to (and nobody awaited it)."""

    # -- sending ----------------------------------------------------------------------------

    async def send_text(self, agent_id: str, content: str) -> None:
        await self.send(agent_id, MessageType.TEXT, {"content": content})

    async def propose_order(
        self,
        customer: str,
        items: Sequence[OrderItemModel | dict[str, Any]],
        *,
        expires_at: str | None = None,
        conversation_id: str | None = None,
    ) -> Order:
        """Send an ORDER_PROPOSAL whose total is computed exactly from the items."""
        models = [OrderItemModel.model_validate(item) for item in items]
        total = sum((money(i.price) * i.quantity for i in models), Decimal(0))
        message_id = uuid.uuid4().hex
        payload: dict[str, Any] = {
            "items": [i.model_dump() for i in models],
            "total_price": money_text(total),
        }
        if expires_at is not None:
            payload["expires_at"] = expires_at
        await self.send(
            customer,
            MessageType.ORDER_PROPOSAL,
            payload,
            conversation_id=conversation_id,
            message_id=message_id,
        )
        return Order(
            message_id=message_id,
            customer=customer,
            items=models,
            total_price=payload["total_price"],
        )

    async def pay(
        self,
        proposal: Message,
        *,
        amount: Decimal | str | None = None,
        timeout: float | None = None,
    ) -> dict[str, Any]:
        """Pay a received ORDER_PROPOSAL (its total, unless `amount` says otherwise); return
        the transaction the lobby confirmed. `LobbyError` (code `invalid_payment`) if refused."""
        total = amount if amount is not None else proposal.payload.get("total_price")
        payload = {
            "amount": str(total),
            "proposal_message_id": proposal.message_id,
        }
        reply = await self.ask_lobby(
            MessageType.PAYMENT, payload, timeout=timeout, receiver_id=proposal.sender_id
        )
        transaction: dict[str, Any] = reply.payload["transaction"]
        return transaction

    async def list_transactions(self) -> list[dict[str, Any]]:
        reply = await self.ask_lobby(MessageType.LIST_TRANSACTIONS, {})
        transactions: list[dict[str, Any]] = reply.payload["transactions"]
        return transactions

    async def fetch_messages(
        self, *, since: int | None = None, limit: int = 100
    ) -> tuple[list[Message], int]:
        """Pull what the lobby holds for this agent after `since` (acknowledging up to it);
        returns the messages and the cursor to pass next time."""
        payload: dict[str, Any] = {"limit": limit}
        if since is not None:
            payload["since"] = since
        reply = await self.ask_lobby(MessageType.FETCH_MESSAGES, payload)
        messages = [_message(m) for m in reply.payload["messages"]]
        return messages, int(reply.payload["cursor"])


def _message(raw: dict[str, Any]) -> Message:
    return decode(orjson.dumps(raw))
