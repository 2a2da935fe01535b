"""agent_sdk/negotiation.py and dialogue.py against a real lobby: typed queries, proposals and
transactions (money as Decimal), one call from either side to end a dialogue in a trade, and a
move that does not fit its model declined with the reason."""

from __future__ import annotations

import asyncio
import contextlib
from decimal import Decimal

import pytest
from pydantic import BaseModel

from agent_sdk import (
    Agent,
    Bidder,
    BidResponse,
    DialogueEndedError,
    DialogueHandle,
    IllegalMoveError,
    LobbyError,
    TaskRFP,
    Transaction,
)
from lobby.server import LobbyServer
from protocol.fipa import MAX_ROUND_REPLY_BY, reveal_order


class Apples(BaseModel):
    apples: int


class Wanted(BaseModel):
    goods: Apples


class Offer(BaseModel):
    goods: Apples
    price: Decimal


class Seller(Agent):
    """Asks 20.50; accepts a counter-offer of 15 or more. Sees everything typed."""

    agent_id = "seller"

    def __init__(self, url: str) -> None:
        super().__init__(lobby_url=url)
        self.queries: list[Wanted] = []
        self.counters: list[Offer] = []
        self.trades: asyncio.Queue[Transaction] = asyncio.Queue()

    async def on_cfp(self, dialogue: DialogueHandle, query: Wanted) -> None:
        self.queries.append(query)
        await dialogue.propose(Offer(goods=query.goods, price=Decimal("20.50")))

    async def on_propose(self, dialogue: DialogueHandle, proposal: Offer) -> None:
        self.counters.append(proposal)
        if proposal.price >= 15:
            await dialogue.accept()
        else:
            await dialogue.decline("too low")

    async def on_transaction_confirmed(self, transaction: Transaction) -> None:
        await self.trades.put(transaction)


async def test_a_typed_haggle_ends_in_a_decimal_trade_with_one_call(lobby: LobbyServer) -> None:
    seller = Seller(lobby.url)
    async with seller, Agent("buyer", lobby_url=lobby.url) as buyer:
        dialogue = await buyer.cfp("seller", Wanted(goods=Apples(apples=3)))
        offer = await dialogue.next_proposal(Offer, timeout=5)
        assert offer == Offer(goods=Apples(apples=3), price=Decimal("20.50"))
        await dialogue.propose(Offer(goods=offer.goods, price=Decimal("15.25")))
        await dialogue.next_move(timeout=5)  # the seller's ACCEPT of the counter-offer
        deal = await dialogue.conclude(timeout=5)  # MATCH_ACCEPT is the buyer's to send
        assert deal is not None
        assert (deal.buyer, deal.seller, deal.amount) == ("buyer", "seller", Decimal("15.25"))
        assert isinstance(deal.amount, Decimal)
        assert deal.goods == Apples(apples=3)  # as Offer, the buyer's counter-offer, declares
        assert dialogue.state == "matched"
        assert seller.queries == [Wanted(goods=Apples(apples=3))]
        assert seller.counters == [Offer(goods=Apples(apples=3), price=Decimal("15.25"))]
        seen_by_seller = await asyncio.wait_for(seller.trades.get(), 5)
        assert seen_by_seller == deal  # read by its annotated on_propose as an Offer
        assert isinstance(seen_by_seller.goods, Apples)


async def test_conclude_accepts_the_offer_and_the_proposer_confirms_by_itself(
    lobby: LobbyServer,
) -> None:
    async with Seller(lobby.url), Agent("buyer", lobby_url=lobby.url) as buyer:
        dialogue = await buyer.cfp("seller", Wanted(goods=Apples(apples=1)))
        await dialogue.next_proposal(Offer, timeout=5)
        deal = await dialogue.conclude(timeout=5)  # ACCEPT; the seller's MATCH_ACCEPT; the trade
        assert deal is not None
        assert deal.amount == Decimal("20.50")
        assert deal.reference == dialogue.dialogue_id
        assert deal.goods == Apples(apples=1)  # the seller's offer, read as an Offer


class DictSeller(Agent):
    """Proposes a dict whose goods are a list, and accepts any counter-offer."""

    agent_id = "dict_seller"

    async def on_cfp(self, dialogue: DialogueHandle, query: object) -> None:
        await dialogue.propose({"goods": [{"pears": 2}], "price": "3.00"})


class Pears(BaseModel):
    pears: int


class PearOffer(BaseModel):
    goods: list[Pears]
    price: Decimal


async def test_goods_come_back_as_json_unless_a_model_declared_them(lobby: LobbyServer) -> None:
    async with DictSeller(lobby_url=lobby.url), Agent("buyer", lobby_url=lobby.url) as buyer:
        untyped = await buyer.cfp("dict_seller", {"pears": 2})
        await untyped.next_move(timeout=5)  # the PROPOSE, raw
        deal = await untyped.conclude(timeout=5)
        assert deal is not None
        assert deal.goods == [{"pears": 2}]
        typed = await buyer.cfp("dict_seller", {"pears": 2})
        await typed.next_proposal(PearOffer, timeout=5)
        deal = await typed.conclude(timeout=5)
        assert deal is not None
        assert deal.goods == [Pears(pears=2)]


async def test_a_declined_counter_offer_ends_conclude_with_the_reason(lobby: LobbyServer) -> None:
    async with Seller(lobby.url), Agent("buyer", lobby_url=lobby.url) as buyer:
        dialogue = await buyer.cfp("seller", Wanted(goods=Apples(apples=1)))
        offer = await dialogue.next_proposal(Offer, timeout=5)
        await dialogue.propose(Offer(goods=offer.goods, price=Decimal(1)))
        with pytest.raises(DialogueEndedError) as ended:
            await dialogue.conclude(timeout=5)
        assert ended.value.kind == "declined"
        assert ended.value.reason == "too low"
        assert str(ended.value) == (
            f"dialogue {dialogue.dialogue_id!r} is over: 'seller' declined it: too low"
        )


async def test_a_dialogue_this_side_declined_says_so_with_its_reason(lobby: LobbyServer) -> None:
    async with Seller(lobby.url), Agent("buyer", lobby_url=lobby.url) as buyer:
        dialogue = await buyer.cfp("seller", Wanted(goods=Apples(apples=1)))
        await dialogue.next_proposal(Offer, timeout=5)
        await dialogue.decline("found it cheaper")
        with pytest.raises(DialogueEndedError) as ended:
            await dialogue.conclude(timeout=5)
        assert ended.value.reason == "found it cheaper"
        assert "'buyer' declined it: found it cheaper" in str(ended.value)


async def test_a_query_that_does_not_fit_the_model_is_declined_naming_the_problem(
    lobby: LobbyServer,
) -> None:
    seller = Seller(lobby.url)
    async with seller, Agent("buyer", lobby_url=lobby.url) as buyer:
        dialogue = await buyer.cfp("seller", {"goods": {"pears": 2}})
        decline = await dialogue.next_move(timeout=5)
        assert decline.kind == "DECLINE"
        assert "the query does not fit Wanted" in decline.payload["reason"]
        assert "goods.apples" in decline.payload["reason"]
        assert seller.queries == []
        with pytest.raises(DialogueEndedError) as ended:
            await dialogue.next_proposal(Offer, timeout=5)
        assert ended.value.reason == decline.payload["reason"]
        assert "'seller' declined it: the query does not fit Wanted" in str(ended.value)


class Grocer(Agent):
    """Answers every CFP with its own price, or declines when it has none."""

    def __init__(self, agent_id: str, url: str, price: Decimal | None) -> None:
        super().__init__(agent_id, lobby_url=url)
        self.price = price

    async def on_cfp(self, dialogue: DialogueHandle, query: Wanted) -> None:
        if self.price is None:
            await dialogue.decline("no apples today")
        else:
            await dialogue.propose(Offer(goods=query.goods, price=self.price))


@pytest.mark.parametrize("sealed", [None, False])
async def test_a_cfp_to_several_returns_the_round_and_one_bid_concludes(
    lobby: LobbyServer, sealed: bool | None
) -> None:
    prices = {"g1": Decimal("9.00"), "g2": Decimal("7.50"), "g3": Decimal("8.25"), "g4": None}
    grocers = [Grocer(name, lobby.url, price) for name, price in prices.items()]
    async with contextlib.AsyncExitStack() as stack:
        for grocer in grocers:
            await stack.enter_async_context(grocer)
        buyer = await stack.enter_async_context(Agent("buyer", lobby_url=lobby.url))
        wanted = Wanted(goods=Apples(apples=2))
        if sealed is None:  # the default for several receivers: sealed
            round_ = await buyer.cfp(list(prices), wanted, reply_by=30, dialogue_id="r1")
        else:
            round_ = await buyer.cfp(
                list(prices), wanted, reply_by=30, dialogue_id="r1", sealed=sealed
            )
        bidders = [bid.agent_id for bid in round_.bids]
        assert sorted(bidders) == ["g1", "g2", "g3"]
        assert round_.declined == {"g4": "no apples today"}
        assert round_.unanswered == []
        if sealed is None:
            assert round_.seed is not None
            assert bidders == reveal_order(round_.seed, ["g1", "g2", "g3"])
        best = min(round_.bids, key=lambda bid: Decimal(bid.proposal["price"]))
        assert best.agent_id == "g2"
        assert best.dialogue.dialogue_id == "r1:g2"
        deal = await best.dialogue.conclude(timeout=10)
        assert deal is not None
        assert (deal.seller, deal.amount) == ("g2", Decimal("7.50"))


async def test_a_round_the_lobby_refuses_fails_its_cfp_at_once_with_the_lobbys_code(
    lobby: LobbyServer,
) -> None:
    async with (
        Grocer("g1", lobby.url, Decimal("9.00")),
        Agent("buyer", lobby_url=lobby.url) as buyer,
    ):
        wanted = Wanted(goods=Apples(apples=2))
        refused_round = "r-refused"
        # reply_by is far beyond the test's own timeout: only the lobby's ERROR can end it.
        with pytest.raises(LobbyError) as refused:
            await asyncio.wait_for(
                buyer.cfp(["g1", "nobody"], wanted, reply_by=3600, dialogue_id=refused_round), 30
            )
        assert refused.value.code == "unknown_receiver"
        assert "nobody" in refused.value.message
        # The lobby opened nothing, so neither does the buyer: the id can be used again.
        assert buyer.dialogue(f"{refused_round}:g1") is None


async def test_a_round_longer_than_the_lobby_allows_is_refused_before_it_is_sent(
    lobby: LobbyServer,
) -> None:
    async with Agent("buyer", lobby_url=lobby.url) as buyer:
        wanted = Wanted(goods=Apples(apples=2))
        with pytest.raises(IllegalMoveError) as refused:
            await buyer.cfp(["g1", "g2"], wanted, reply_by=MAX_ROUND_REPLY_BY + 1, dialogue_id="r")
        assert refused.value.rule == "bad_payload"
        assert "at most 86400 seconds" in str(refused.value)
        assert buyer.dialogue("r:g1") is None
        assert lobby.router.negotiations.sealed.rounds == {}
        assert sum(lobby.router.counters.refused.values()) == 0  # nothing reached it to refuse


class Idle(Bidder):
    """Found by an auction; never asked here."""

    async def bid(self, rfp: TaskRFP) -> BidResponse:
        raise AssertionError("no CFP was to reach a bidder")


async def test_an_auction_longer_than_a_round_may_last_fails_before_any_cfp(
    lobby: LobbyServer,
) -> None:
    async with (
        Idle("b1", lobby_url=lobby.url),
        Idle("b2", lobby_url=lobby.url),
        Agent("buyer", lobby_url=lobby.url) as buyer,
    ):
        result = await buyer.auction("anything", timeout=MAX_ROUND_REPLY_BY + 1)
    assert not result.success
    assert "at most 86400 seconds" in str(result.error_message)
    assert lobby.router.negotiations.dialogues == {}
    assert sum(lobby.router.counters.refused.values()) == 0  # the SDK sent no CFP to refuse
