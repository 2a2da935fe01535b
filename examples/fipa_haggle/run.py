"""The OEF haggle, move for move, over a real lobby: the lobby checks each move, then confirms
the trade to both parties as the TAC controller.

    id  agent  move            target
    1   b      cfp(r)          -
    2   s      propose(r, 20)  1
    3   b      propose(r, 10)  2
    4   s      propose(r, 15)  3
    5   b      accept()        4
    6   s      match_accept()  5     -> TRANSACTION_CONFIRMED to b and s, at 15

    .venv/bin/python -m examples.fipa_haggle.run [--lobby-url ws://127.0.0.1:8765/]
"""

from __future__ import annotations

import argparse
import asyncio
import os
from dataclasses import dataclass, field
from typing import Any

from agent_sdk import Agent, DialogueHandle
from examples import spread

GOODS = {"r": 1}


class Seller(Agent):
    """Asks 20, then meets the buyer halfway."""

    agent_id = "s"

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.confirmed: asyncio.Future[dict[str, Any]] = asyncio.Future()

    async def on_cfp(self, dialogue: DialogueHandle, query: dict[str, Any]) -> None:
        await dialogue.propose({"goods": GOODS, "price": 20})

    async def on_propose(self, dialogue: DialogueHandle, proposal: dict[str, Any]) -> None:
        await dialogue.propose({"goods": GOODS, "price": 15})

    async def on_accept(self, dialogue: DialogueHandle) -> None:
        await dialogue.match_accept()

    async def on_transaction_confirmed(self, transaction: dict[str, Any]) -> None:
        self.confirmed.set_result(transaction)


@dataclass
class Haggle:
    table: list[tuple[str, str, Any]] = field(default_factory=list)
    transaction: dict[str, Any] = field(default_factory=dict)
    seller_saw: dict[str, Any] = field(default_factory=dict)


async def main(lobby_url: str) -> Haggle:
    haggle = Haggle()
    async with (
        Seller(lobby_url=spread(lobby_url, 0)) as seller,
        Agent("b", lobby_url=spread(lobby_url, 1)) as buyer,
    ):
        dialogue = await buyer.cfp("s", {"goods": GOODS})
        haggle.table.append(("b", "cfp", GOODS))
        offer = await dialogue.next_move(timeout=5)
        haggle.table.append(("s", "propose", offer.payload["proposal"]["price"]))
        await dialogue.propose({"goods": GOODS, "price": 10})
        haggle.table.append(("b", "propose", 10))
        counter = await dialogue.next_move(timeout=5)
        haggle.table.append(("s", "propose", counter.payload["proposal"]["price"]))
        await dialogue.accept()
        haggle.table.append(("b", "accept", None))
        matched = await dialogue.next_move(timeout=5)
        haggle.table.append(("s", matched.kind.lower(), None))
        confirmation = await dialogue.next_move(timeout=5)
        haggle.transaction = confirmation.payload["transaction"]
        haggle.seller_saw = await asyncio.wait_for(seller.confirmed, 5)
    for number, (agent, move, detail) in enumerate(haggle.table, start=1):
        print(f"{number}  {agent}  {move}({'' if detail is None else detail})")
    tx = haggle.transaction
    print(
        f"TRANSACTION_CONFIRMED: {tx['buyer']} buys {tx['goods']} from {tx['seller']}"
        f" at {tx['amount']}"
    )
    return haggle


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lobby-url", default=os.environ.get("LOBBY_URL", "ws://127.0.0.1:8765/"))
    asyncio.run(main(parser.parse_args().lobby_url))
