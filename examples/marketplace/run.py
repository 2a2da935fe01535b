"""The marketplace, end to end over a real lobby: customers search for businesses, ask each for
an offer in TEXT, get ORDER_PROPOSALs back, pay the cheapest, and both sides see the
PAYMENT_CONFIRMED the lobby sends after checking the payment. Deterministic: no language model.

    .venv/bin/python -m examples.marketplace.run [--lobby-url ws://127.0.0.1:8765/]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from agent_sdk import Agent, Capability, Message
from examples import spread

MENUS: dict[str, dict[str, Any]] = {
    "luigis_pizza": {
        "description": "Wood-fired pizza delivered hot in Rome",
        "keywords": ["pizza", "italian", "delivery"],
        "attributes": {"city": "rome", "cuisine": "italian"},
        "menu": {"margherita": "8.50", "marinara": "7.10"},
    },
    "napoli_express": {
        "description": "Fast pizza delivery, Neapolitan style",
        "keywords": ["pizza", "delivery"],
        "attributes": {"city": "rome", "cuisine": "italian"},
        "menu": {"margherita": "7.90", "marinara": "6.60"},
    },
    "sushi_zen": {
        "description": "Sushi and sashimi platters",
        "keywords": ["sushi", "japanese"],
        "attributes": {"city": "rome", "cuisine": "japanese"},
        "menu": {"nigiri": "12.00"},
    },
}


class Business(Agent):
    """Answers any TEXT with an order proposal for the dish named in it."""

    def __init__(self, agent_id: str, **options: Any) -> None:
        super().__init__(agent_id, **options)
        self.menu: dict[str, str] = MENUS[agent_id]["menu"]
        self.sales: list[dict[str, Any]] = []

    def capability_models(self) -> list[Capability]:
        """What customers search: description, keywords and attributes from the menu."""
        info = MENUS[self.agent_id]
        return [
            Capability(
                name="take_orders",
                description=info["description"],
                keywords=info["keywords"],
                attributes=info["attributes"],
            )
        ]

    async def on_text(self, message: Message, content: str) -> None:
        dish, _, count = content.partition(" x")
        if dish not in self.menu:
            await self.send_text(message.sender_id, f"sorry, no {dish}")
            return
        item = {"id": dish, "name": dish, "price": self.menu[dish], "quantity": int(count or 1)}
        await self.propose_order(message.sender_id, [item])

    async def on_payment_confirmed(self, transaction: dict[str, Any]) -> None:
        self.sales.append(transaction)


class Customer(Agent):
    """Searches, asks every match for `dish`, pays the cheapest proposal."""

    def __init__(self, agent_id: str, dish: str, count: int, **options: Any) -> None:
        super().__init__(agent_id, **options)
        self.dish, self.count = dish, count
        self.proposals: asyncio.Queue[Message] = asyncio.Queue()

    async def on_order_proposal(self, message: Message, proposal: dict[str, Any]) -> None:
        self.proposals.put_nowait(message)

    async def shop(self, query: str) -> dict[str, Any]:
        found = await self.search(
            query, algorithm="lexical", filters=[{"attribute": "city", "value": "rome"}]
        )
        for service in found:
            await self.send_text(service.agent_id, f"{self.dish} x{self.count}")
        offers = [await asyncio.wait_for(self.proposals.get(), 5) for _ in found]
        best = min(offers, key=lambda m: (Decimal(str(m.payload["total_price"])), m.sender_id))
        return await self.pay(best)


@dataclass
class Outcome:
    receipts: dict[str, dict[str, Any]] = field(default_factory=dict)
    sales: dict[str, list[dict[str, Any]]] = field(default_factory=dict)


async def main(lobby_url: str) -> Outcome:
    businesses = [Business(name, lobby_url=spread(lobby_url, n)) for n, name in enumerate(MENUS)]
    customers = [
        Customer("ann", "margherita", 2, lobby_url=spread(lobby_url, 1)),
        Customer("bob", "marinara", 1, lobby_url=spread(lobby_url, 0)),
    ]
    outcome = Outcome()
    async with contextlib.AsyncExitStack() as stack:
        for agent in (*businesses, *customers):
            await stack.enter_async_context(agent)
        receipts = await asyncio.gather(*(c.shop("pizza delivery") for c in customers))
        outcome.receipts = {c.agent_id: r for c, r in zip(customers, receipts, strict=True)}
        await asyncio.sleep(0.2)  # let the businesses' PAYMENT_CONFIRMED callbacks run
        outcome.sales = {b.agent_id: b.sales for b in businesses}
        await asyncio.gather(*(a.unregister() for a in (*businesses, *customers)))
    for customer, receipt in outcome.receipts.items():
        print(
            f"{customer} paid {receipt['seller']} {receipt['amount']} ({receipt['transaction_id']})"
        )
    return outcome


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lobby-url", default=os.environ.get("LOBBY_URL", "ws://127.0.0.1:8765/"))
    asyncio.run(main(parser.parse_args().lobby_url))
