"""A small Trading Agents Competition over the lobby, with the lobby as controller.

Each trader holds goods and money and values goods with a Cobb-Douglas utility
(sum of weight x ln(quantity)). The seed's baseline strategy: a trader supplies its holdings
minus one of each good and demands one more of each. In turn, every trader looks for a seller of
the good it values most at the margin (search with a filter on the sellers' `supply_*`
attributes), sends a CFP, and haggles: the seller asks its marginal loss (x 10 money per unit
of utility) plus a margin, the buyer accepts when that is below its marginal gain. The lobby
checks every move and, on MATCH_ACCEPT, records the trade and confirms it to both; holdings
change only then.

    .venv/bin/python -m examples.tac.run [--lobby-url ws://127.0.0.1:8765/]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import os
from typing import Any

from agent_sdk import Agent, Capability, DialogueHandle

GOODS = ("g0", "g1", "g2", "g3")
PRICE_PER_UTIL = 10.0
MARGIN = 0.25

START: dict[str, dict[str, Any]] = {
    "trader_a": {"holdings": [5, 1, 2, 3], "weights": [0.1, 0.4, 0.3, 0.2]},
    "trader_b": {"holdings": [1, 5, 2, 2], "weights": [0.4, 0.1, 0.2, 0.3]},
    "trader_c": {"holdings": [2, 2, 5, 1], "weights": [0.3, 0.2, 0.1, 0.4]},
}


class Trader(Agent):
    def __init__(self, agent_id: str, **options: Any) -> None:
        super().__init__(agent_id, **options)
        self.holdings: dict[str, int] = dict(zip(GOODS, START[agent_id]["holdings"], strict=True))
        self.weights: dict[str, float] = dict(zip(GOODS, START[agent_id]["weights"], strict=True))
        self.money = 100.0
        self.trades: list[dict[str, Any]] = []

    # -- the baseline strategy -------------------------------------------------------------

    def utility(self) -> float:
        return sum(w * math.log(self.holdings[g]) for g, w in self.weights.items())

    def supplied(self) -> dict[str, int]:
        return {g: max(q - 1, 0) for g, q in self.holdings.items()}

    def marginal_gain(self, good: str) -> float:
        q = self.holdings[good]
        return self.weights[good] * (math.log(q + 1) - math.log(q)) * PRICE_PER_UTIL

    def marginal_loss(self, good: str) -> float:
        q = self.holdings[good]
        return self.weights[good] * (math.log(q) - math.log(q - 1)) * PRICE_PER_UTIL

    def capability_models(self) -> list[Capability]:
        supply = {f"supply_{g}": q for g, q in self.supplied().items()}
        return [Capability(name="tac_trade", description="sells goods", attributes=supply)]

    # -- buying ----------------------------------------------------------------------------

    async def buy_once(self) -> dict[str, Any] | None:
        good = max(GOODS, key=self.marginal_gain)
        sellers = await self.search(
            algorithm="filtered",
            filters=[{"attribute": f"supply_{good}", "op": "ge", "value": 1}],
        )
        for seller in sellers:
            dialogue = await self.cfp(seller.agent_id, {"goods": {good: 1}, "role": "buyer"})
            move = await dialogue.next_move(timeout=5)
            if move.kind != "PROPOSE":
                continue
            price = float(move.payload["proposal"]["price"])
            if price >= self.marginal_gain(good):
                await dialogue.decline("too expensive")
                continue
            await dialogue.accept()
            while move.kind != "TRANSACTION_CONFIRMED":
                move = await dialogue.next_move(timeout=5)
            transaction: dict[str, Any] = move.payload["transaction"]
            return transaction
        return None

    # -- selling ---------------------------------------------------------------------------

    async def on_cfp(self, dialogue: DialogueHandle, query: dict[str, Any]) -> None:
        ((good, quantity),) = query["goods"].items()
        if self.supplied()[good] < quantity:
            await dialogue.decline("none to spare")
            return
        price = round(self.marginal_loss(good) * (1 + MARGIN), 2)
        await dialogue.propose({"goods": {good: quantity}, "price": price})

    async def on_accept(self, dialogue: DialogueHandle) -> None:
        await dialogue.match_accept()

    async def on_transaction_confirmed(self, transaction: dict[str, Any]) -> None:
        """The controller confirmed a trade: only now do holdings and money change."""
        sign = 1 if transaction["buyer"] == self.agent_id else -1
        for good, quantity in transaction["goods"].items():
            self.holdings[good] += sign * quantity
        self.money -= sign * float(transaction["amount"])
        self.trades.append(transaction)
        await self.update_capabilities()  # the supply others search for has changed


def table(traders: list[Trader], title: str) -> str:
    lines = [title]
    for t in traders:
        holdings = " ".join(f"{g}={q}" for g, q in t.holdings.items())
        lines.append(f"  {t.agent_id}: {holdings}  money={t.money:7.2f}  utility={t.utility():.4f}")
    return "\n".join(lines)


async def main(lobby_url: str, rounds: int = 2) -> list[Trader]:
    traders = [Trader(name, lobby_url=lobby_url) for name in START]
    async with contextlib.AsyncExitStack() as stack:
        for trader in traders:
            await stack.enter_async_context(trader)
        print(table(traders, "before"))
        for _ in range(rounds):
            for trader in traders:
                await trader.buy_once()
                await asyncio.sleep(0.05)  # let both sides' confirmations land
        print(table(traders, "after"))
        await asyncio.gather(*(t.unregister() for t in traders))
    return traders


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lobby-url", default=os.environ.get("LOBBY_URL", "ws://127.0.0.1:8765/"))
    asyncio.run(main(parser.parse_args().lobby_url))
