"""The examples run to the end against a real lobby."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from typing import Any

from agent_sdk import Agent, CapabilityError, RequestContext, capability
from examples.agora import run as agora
from examples.echo.echo_agent import EchoAgent
from examples.fipa_haggle import run as fipa_haggle
from examples.marketplace import run as marketplace
from examples.price_hunter import run as price_hunter
from examples.pricer import run as pricer
from examples.tac import run as tac
from lobby.server import LobbyServer
from tests.conftest import LobbyProcess


async def test_price_hunter_scenario(lobby: LobbyServer) -> None:
    outcome = await price_hunter.main(lobby.url)
    assert outcome.progress == ["found on amazon.com, hunting prices"]
    assert outcome.result.item_found_on_site.regular_price == 128.0
    cheapest = outcome.result.cheapest_price_globally
    assert (cheapest.cheapest_price, cheapest.source) == (108.8, "DiscountDealz.com")
    assert outcome.result.message == "Search complete."
    assert outcome.rogue_refusal == (
        "Unauthorized: Agent 'rogue_007' is not authorized to call capability "
        "'find_cheapest_item_price_v2' on agent 'price_hunter_A2_v2'."
    )


class Decoy(Agent):
    """Another agent of a shared lobby offering what the examples call, answering nothing
    useful: an example that takes whichever provider it finds first fails."""

    agent_id = "decoy"

    @capability("quote", description="A quote from someone else.")
    async def quote(self, request: dict[str, Any], ctx: RequestContext) -> dict[str, Any]:
        raise CapabilityError("the decoy was called", code="decoy")

    @capability("find_cheapest_item_price_v2", description="Prices from someone else.")
    async def hunt(self, request: dict[str, Any], ctx: RequestContext) -> dict[str, Any]:
        raise CapabilityError("the decoy was called", code="decoy")

    @capability("echo", description="An echo from someone else.")
    async def echo(self, request: dict[str, Any], ctx: RequestContext) -> dict[str, Any]:
        raise CapabilityError("the decoy was called", code="decoy")


async def test_every_example_script_runs_twice_against_one_lobby_process(
    lobby_process: LobbyProcess,
) -> None:
    """Scripts as a user runs them, on a lobby that already holds another agent offering the
    same capabilities; the second run resumes every agent of the first that did not unregister
    (their tokens were saved) and ends the same way."""
    async with Decoy(lobby_url=lobby_process.url):
        await asyncio.to_thread(_run_every_example_twice, lobby_process)


def _run_every_example_twice(lobby_process: LobbyProcess) -> None:
    expected = {
        "echo": ["echo answered: 'hi' (2 characters)"],
        "price_hunter": ["Search complete.", "rogue_007 <- lobby: Unauthorized"],
        "fipa_haggle": ["TRANSACTION_CONFIRMED: b buys {'r': 1} from s at 15.00"],
        "agora": ["Bids: sealed, revealed together", "Winner: summarizer"],
        "tac": ["trader_c: g0=2 g1=2 g2=5 g3=2  money=  98.99  utility=0.7848"],
        "marketplace": ["ann paid napoli_express 15.80", "bob paid napoli_express 6.60"],
        "pricer": ["bought 10 apples at 11.00"],
    }
    for _ in range(2):
        for example, lines in expected.items():
            done = subprocess.run(
                [sys.executable, "-m", f"examples.{example}.run", "--lobby-url", lobby_process.url],
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert done.returncode == 0, done.stderr[-2000:]
            for line in lines:
                assert line in done.stdout
            # The SDK warns of a lobby ERROR nobody awaited: a run as written earns none.
            assert "LOBBY_ERROR" not in done.stdout + done.stderr, example
    resumed = {e["agent_id"] for e in lobby_process.events() if e["event"] == "AGENT_RESUMED"}
    assert resumed == {
        *("echo", "my_client"),
        *("shopper", "item_search_agent", "price_hunter_A2_v2", "rogue_007"),
        *("s", "b"),
        *("apple_pricer", "grocer", "stranger"),
    }


async def test_pricer_meets_each_failure_as_its_own_class_then_trades(
    lobby: LobbyServer,
) -> None:
    assert await pricer.main(lobby.url) == [
        "quote is offered by apple_pricer",
        "an apple costs 1.20",
        "stranger: UnauthorizedError",
        "bad input: InvalidInputError",
        "pear: UnknownItemError (no price for 'pear')",
        "truffle: RemoteTimeoutError",
        "fourth quote: RateLimitedError",
        "offered 10 apples at 12.00",
        "bought 10 apples at 11.00",
    ]


async def test_echo_agent(lobby: LobbyServer) -> None:
    async with EchoAgent(lobby_url=lobby.url), Agent("my_client", lobby_url=lobby.url) as caller:
        assert await caller.request("echo", "echo", {"text": "hello"}) == {
            "text": "hello",
            "length": 5,
        }


async def test_fipa_haggle_reproduces_the_seed_table(lobby: LobbyServer) -> None:
    haggle = await fipa_haggle.main(lobby.url)
    assert haggle.table == [
        ("b", "cfp", {"r": 1}),
        ("s", "propose", 20),
        ("b", "propose", 10),
        ("s", "propose", 15),
        ("b", "accept", None),
        ("s", "match_accept", None),
    ]
    tx = haggle.transaction
    assert (tx["buyer"], tx["seller"], tx["amount"], tx["goods"]) == ("b", "s", "15.00", {"r": 1})
    assert haggle.seller_saw == tx
    assert lobby.router.ledger.transactions == [tx]


async def test_agora_auction_picks_the_best_scored_bid(lobby: LobbyServer) -> None:
    result = await agora.main(lobby.url)
    # summarizer: 0.6 * 0.95 + 0.4 * 2/2 = 0.97; analyzer: 0.6 * 0.75 + 0.4 * 1/2 = 0.65
    assert result.success
    assert result.agent_id == "summarizer"
    assert result.output.startswith("[summarizer] Summarize quantum computing")
    assert result.rfp_id == agora.RFP.id


async def test_agora_with_open_bids_picks_the_same_winner(lobby: LobbyServer) -> None:
    result = await agora.main(lobby.url, sealed=False)
    assert (result.success, result.agent_id) == (True, "summarizer")


async def test_agora_threshold_and_no_bidders(lobby: LobbyServer) -> None:
    strict = await agora.main(lobby.url, min_confidence=0.99)
    assert (strict.success, strict.error_message) == (False, "No bids met minimum confidence")
    nobody = await agora.main(lobby.url, required_skills=["cooking"])
    assert (nobody.success, nobody.error_message) == (False, "No bidders registered")


async def test_marketplace_customers_pay_the_cheapest_offer(lobby: LobbyServer) -> None:
    outcome = await marketplace.main(lobby.url)
    ann, bob = outcome.receipts["ann"], outcome.receipts["bob"]
    assert (ann["seller"], ann["amount"]) == ("napoli_express", "15.80")
    assert (bob["seller"], bob["amount"]) == ("napoli_express", "6.60")
    assert sorted(t["buyer"] for t in outcome.sales["napoli_express"]) == ["ann", "bob"]
    assert outcome.sales["luigis_pizza"] == outcome.sales["sushi_zen"] == []
    ledger = lobby.router.ledger.transactions
    assert sorted((t["buyer"], t["seller"], t["amount"], t["kind"]) for t in ledger) == [
        ("ann", "napoli_express", "15.80", "payment"),
        ("bob", "napoli_express", "6.60", "payment"),
    ]


async def test_tac_trades_are_confirmed_by_the_lobby_and_conserve_goods(
    lobby: LobbyServer,
) -> None:
    before = {name: sum(start["holdings"]) for name, start in tac.START.items()}
    traders = await tac.main(lobby.url)
    ledger = lobby.router.ledger.transactions
    assert ledger, "no trade happened"
    assert all(t["kind"] == "negotiation" for t in ledger)
    # Goods and money only moved between traders, and only through confirmed trades.
    assert sum(sum(t.holdings.values()) for t in traders) == sum(before.values())
    assert round(sum(t.money for t in traders), 6) == 300.0
    for trader in traders:
        assert trader.trades == [t for t in ledger if trader.agent_id in (t["buyer"], t["seller"])]
    # The baseline strategy only trades when the buyer gains more than the seller loses.
    start = [tac.Trader(name) for name in tac.START]
    assert sum(t.utility() for t in traders) > sum(t.utility() for t in start)
