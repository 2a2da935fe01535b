"""The price-hunting scenario: a search agent, a price hunter only it may call, and a rogue.

- `item_search_agent` offers `initiate_item_search_v2` to anyone: it looks the item up on the
  target website, then asks `price_hunter_A2_v2` for the cheapest price anywhere.
- `price_hunter_A2_v2` offers `find_cheapest_item_price_v2`, authorized for the search agent
  only; the lobby refuses everyone else.
- `rogue_007` calls the price hunter directly and is refused by the lobby.

Catalogues are fixed data so the run is deterministic.
"""

from __future__ import annotations

from pydantic import BaseModel

from agent_sdk import Agent, CapabilityError, RequestContext, capability

SEARCH_AGENT_ID = "item_search_agent"
PRICE_HUNTER_ID = "price_hunter_A2_v2"
ROGUE_ID = "rogue_007"

SITE_CATALOGUE: dict[str, dict[str, float]] = {
    "amazon.com": {"Bose QuietComfort headphones": 128.0, "Best Ever Laptop X1000": 999.0},
    "ebay.com": {"Bose QuietComfort headphones": 119.5},
}
DEAL_SITES: dict[str, dict[str, float]] = {
    "DiscountDealz.com": {"Bose QuietComfort headphones": 108.8, "Best Ever Laptop X1000": 899.0},
    "BargainBin.net": {"Bose QuietComfort headphones": 112.0},
}


class ItemSearchRequest(BaseModel):
    item_to_find: str
    target_website: str


class SiteItem(BaseModel):
    name: str
    description: str
    regular_price: float
    source_website: str
    url: str


class PriceQuery(BaseModel):
    item_name: str


class CheapestPrice(BaseModel):
    item_name: str
    cheapest_price: float
    source: str
    url: str


class ItemSearchResult(BaseModel):
    item_found_on_site: SiteItem
    cheapest_price_globally: CheapestPrice
    message: str


class PriceHunter(Agent):
    agent_id = PRICE_HUNTER_ID

    @capability(
        "find_cheapest_item_price_v2",
        description="Finds the cheapest price of an item across deal sites.",
        keywords=["price", "cheapest", "shopping"],
        authorized=[SEARCH_AGENT_ID],
    )
    async def find_cheapest(self, query: PriceQuery, ctx: RequestContext) -> CheapestPrice:
        offers = [
            (price, site)
            for site, items in DEAL_SITES.items()
            if (price := items.get(query.item_name)) is not None
        ]
        if not offers:
            raise CapabilityError(f"no deal found for {query.item_name!r}", code="not_found")
        price, site = min(offers)
        slug = query.item_name.replace(" ", "_")
        return CheapestPrice(
            item_name=query.item_name,
            cheapest_price=price,
            source=site,
            url=f"http://{site.lower()}/{slug}",
        )


class ItemSearchAgent(Agent):
    agent_id = SEARCH_AGENT_ID

    @capability(
        "initiate_item_search_v2",
        description="Finds an item on a website and the cheapest price for it anywhere.",
        keywords=["search", "shopping"],
    )
    async def initiate_item_search(
        self, request: ItemSearchRequest, ctx: RequestContext
    ) -> ItemSearchResult:
        price = SITE_CATALOGUE.get(request.target_website, {}).get(request.item_to_find)
        if price is None:
            raise CapabilityError(
                f"{request.item_to_find!r} is not sold on {request.target_website}",
                code="not_found",
            )
        await ctx.progress({"message": f"found on {request.target_website}, hunting prices"})
        # A shared lobby may hold other agents offering the capability: pick ours by id.
        hunters = await self.discover("find_cheapest_item_price_v2")
        if not any(hunter.agent_id == PRICE_HUNTER_ID for hunter in hunters):
            raise CapabilityError(f"{PRICE_HUNTER_ID} is not registered", code="unavailable")
        cheapest = await self.request(
            PRICE_HUNTER_ID,
            "find_cheapest_item_price_v2",
            PriceQuery(item_name=request.item_to_find),
            output_type=CheapestPrice,
        )
        slug = request.item_to_find.replace(" ", "_")
        site_item = SiteItem(
            name=f"{request.item_to_find} - {request.target_website}",
            description=f"{request.item_to_find} as listed on {request.target_website}",
            regular_price=price,
            source_website=request.target_website,
            url=f"http://{request.target_website}/{slug}",
        )
        return ItemSearchResult(
            item_found_on_site=site_item,
            cheapest_price_globally=cheapest,
            message="Search complete.",
        )
