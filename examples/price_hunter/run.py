"""Run the price-hunting scenario against a lobby.

    make run                                  # in one terminal: the lobby
    .venv/bin/python -m examples.price_hunter.run  # in another (LOBBY_URL or --lobby-url)

A shopper asks the search agent for headphones (the search agent calls the price hunter, which
only it may call); then `rogue_007` calls the price hunter directly and is refused.
"""

from __future__ import annotations

import argparse
import asyncio
import os
from dataclasses import dataclass

from agent_sdk import Agent, UnauthorizedError
from examples.price_hunter.agents import (
    PRICE_HUNTER_ID,
    ROGUE_ID,
    SEARCH_AGENT_ID,
    ItemSearchAgent,
    ItemSearchResult,
    PriceHunter,
)


@dataclass
class Outcome:
    progress: list[str]
    result: ItemSearchResult
    rogue_refusal: str


async def main(lobby_url: str) -> Outcome:
    async with (
        PriceHunter(lobby_url=lobby_url),
        ItemSearchAgent(lobby_url=lobby_url),
        Agent("shopper", lobby_url=lobby_url) as shopper,
        Agent(ROGUE_ID, lobby_url=lobby_url) as rogue,
    ):
        progress: list[str] = []
        final: dict[str, object] = {}
        async for update in shopper.request_stream(
            SEARCH_AGENT_ID,
            "initiate_item_search_v2",
            {"item_to_find": "Bose QuietComfort headphones", "target_website": "amazon.com"},
        ):
            if update.get("status") == "in_progress":
                progress.append(str(update["message"]))
            else:
                final = update
        result = ItemSearchResult.model_validate(final)
        print(f"shopper <- {SEARCH_AGENT_ID}: {result.model_dump_json(indent=2)}")
        try:
            await rogue.request(
                PRICE_HUNTER_ID,
                "find_cheapest_item_price_v2",
                {"item_name": "Bose QuietComfort headphones"},
            )
        except UnauthorizedError as refused:
            refusal = refused.message
        else:  # pragma: no cover - the lobby must refuse
            raise SystemExit("the lobby let rogue_007 through")
        print(f"{ROGUE_ID} <- lobby: {refusal}")
        return Outcome(progress, result, refusal)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lobby-url", default=os.environ.get("LOBBY_URL", "ws://127.0.0.1:8765/"))
    asyncio.run(main(parser.parse_args().lobby_url))
