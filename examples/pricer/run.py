"""The SDK's whole story in one script: a pricer capability only one buyer may call (three
calls a minute), discovery, a stranger, a bad input, an unknown item, a timeout, a typed haggle
with a counter-offer, and a clean stop. Every failure arrives as its own `AgentSDKError`
subclass, and the script prints only what it prints.

    .venv/bin/python -m examples.pricer.run [--lobby-url ws://127.0.0.1:8765/]
"""

from __future__ import annotations

import argparse
import asyncio
import os
from collections.abc import Awaitable
from decimal import Decimal

from pydantic import BaseModel

from agent_sdk import (
    Agent,
    AgentSDKError,
    CapabilityError,
    DialogueHandle,
    RateLimit,
    RemoteError,
    RequestContext,
    capability,
)

PRICES = {"apple": Decimal("1.20")}


class Item(BaseModel):
    name: str


class Quote(BaseModel):
    name: str
    price: Decimal


class Apples(BaseModel):
    apples: int


class Offer(BaseModel):
    goods: Apples
    price: Decimal


class UnknownItemError(RemoteError, code="unknown_item"):
    """The pricer has no price for the item (its handler's CapabilityError code)."""


class Pricer(Agent):
    agent_id = "apple_pricer"

    @capability(
        "quote",
        description="The unit price of an item.",
        authorized=["grocer"],
        rate_limit=RateLimit(calls=3, per=60.0),
        timeout=0.5,
    )
    async def quote(self, request: Item, ctx: RequestContext) -> Quote:
        if request.name == "truffle":
            await asyncio.sleep(5)  # longer than the capability's timeout
        if request.name not in PRICES:
            raise CapabilityError(f"no price for {request.name!r}", code="unknown_item")
        return Quote(name=request.name, price=PRICES[request.name])

    async def on_cfp(self, dialogue: DialogueHandle, query: Apples) -> None:
        await dialogue.propose(Offer(goods=query, price=PRICES["apple"] * query.apples))

    async def on_propose(self, dialogue: DialogueHandle, proposal: Offer) -> None:
        asked = PRICES["apple"] * proposal.goods.apples
        if proposal.price >= asked * Decimal("0.9"):
            await dialogue.accept()
        else:
            await dialogue.decline(f"below {asked * Decimal('0.9')}")


async def failure(call: Awaitable[object]) -> str:
    """The name of the SDK error `call` raises."""
    try:
        await call
    except AgentSDKError as exc:
        return type(exc).__name__
    return "no error"


async def main(lobby_url: str) -> list[str]:
    lines: list[str] = []

    def say(line: str) -> None:
        print(line)
        lines.append(line)

    async with (
        Pricer(lobby_url=lobby_url),
        Agent("grocer", lobby_url=lobby_url) as grocer,
        Agent("stranger", lobby_url=lobby_url) as stranger,
    ):
        # Other agents may offer `quote` too: the grocer checks that its pricer is among them.
        offers = {service.agent_id for service in await grocer.discover("quote")}
        if "apple_pricer" in offers:
            say("quote is offered by apple_pricer")
        quote = await grocer.request("apple_pricer", "quote", Item(name="apple"), output_type=Quote)
        say(f"an apple costs {quote.price}")
        say("stranger: " + await failure(stranger.request("apple_pricer", "quote", {"name": "x"})))
        say("bad input: " + await failure(grocer.request("apple_pricer", "quote", {"name": 7})))
        try:
            await grocer.request("apple_pricer", "quote", Item(name="pear"))
        except UnknownItemError as exc:
            say(f"pear: {type(exc).__name__} ({exc.message})")
        truffle = grocer.request("apple_pricer", "quote", Item(name="truffle"), timeout=5)
        say("truffle: " + await failure(truffle))
        say(
            "fourth quote: "
            + await failure(grocer.request("apple_pricer", "quote", Item(name="apple")))
        )

        dialogue = await grocer.cfp("apple_pricer", Apples(apples=10))
        offer = await dialogue.next_proposal(Offer, timeout=5)
        say(f"offered {offer.goods.apples} apples at {offer.price}")
        await dialogue.propose(Offer(goods=offer.goods, price=offer.price - 1))
        deal = await dialogue.conclude(timeout=5)
        assert deal is not None
        say(f"bought {deal.goods.apples} apples at {deal.amount}")
    return lines


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lobby-url", default=os.environ.get("LOBBY_URL", "ws://127.0.0.1:8765/"))
    asyncio.run(main(parser.parse_args().lobby_url))
