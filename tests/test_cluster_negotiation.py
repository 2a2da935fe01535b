"""Negotiation and payment between agents on different lobby nodes: real `lobby serve --cluster`
processes on one real `nats-server -js`, agents talking raw WebSocket. A dialogue is decided
by its initiator's home, a proposal's payments by its proposer's home."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from websockets.asyncio.client import connect

from tests.natskit import nats_server
from tests.routerkit import cap
from tests.test_cluster_node import node
from tests.test_cluster_registry import Agent, agent
from tests.test_cluster_routing import journaled_ids, send
from tests.test_durability import stop
from tests.wsclient import frame, reply

TRADES = [cap("trade")]


def proposal(price: int) -> dict[str, Any]:
    return {"proposal": {"goods": {"rice_kg": 2}, "price": price}}


async def move(
    sender: Agent, receiver: Agent, performative: str, mid: str, reply_to: str | None, **p: Any
) -> dict[str, Any]:
    """Send a move of dialogue `d1` and return it as its receiver got it."""
    extra: dict[str, Any] = {"conversation_id": "d1", "message_id": mid}
    if reply_to is not None:
        extra["in_reply_to"] = reply_to
    await send(sender, receiver.agent_id, performative, p, **extra)
    got = await reply(receiver.ws)
    assert (got["message_type"], got["message_id"]) == (performative, mid), got
    return got


async def transactions(party: Agent) -> list[dict[str, Any]]:
    answer = await party.ask("LIST_TRANSACTIONS", {})
    assert answer["message_type"] == "TRANSACTIONS", answer
    found: list[dict[str, Any]] = answer["payload"]["transactions"]
    return found


async def test_a_haggle_between_nodes_is_decided_on_the_initiators_node(tmp_path: Path) -> None:
    async with nats_server(tmp_path) as nats:
        a, b = node(tmp_path / "a", nats, "a"), node(tmp_path / "b", nats, "b")
        try:
            async with (
                agent(a, "alice", acks=False, capabilities=TRADES) as alice,
                agent(b, "bob", acks=False, capabilities=TRADES) as bob,
            ):
                await alice.until_discovered({"bob": ["trade"]})
                await bob.until_discovered({"alice": ["trade"]})
                await move(alice, bob, "CFP", "m1", None, query={"goods": "rice"})
                await move(bob, alice, "PROPOSE", "m2", "m1", **proposal(20))
                # An illegal move made on b (bob's turn is over) is refused by a, which holds
                # the dialogue, to bob alone; alice never sees it and nothing changes.
                await send(
                    bob, "alice", "PROPOSE", proposal(1), conversation_id="d1", in_reply_to="m1"
                )
                refused = await reply(bob.ws)
                assert refused["message_type"] == "ERROR"
                assert refused["payload"]["code"] == "invalid_dialogue"
                assert "turn_taking" in refused["payload"]["error"]
                await move(alice, bob, "PROPOSE", "m3", "m2", **proposal(10))
                await move(bob, alice, "PROPOSE", "m4", "m3", **proposal(15))
                await move(alice, bob, "ACCEPT", "m5", "m4")
                await move(bob, alice, "MATCH_ACCEPT", "m6", "m5")
                # The controller on a confirms the trade to both parties, each on its node.
                confirmed = [await reply(alice.ws), await reply(bob.ws)]
                for notice in confirmed:
                    assert notice["message_type"] == "TRANSACTION_CONFIRMED", notice
                    assert notice["sender_id"] == "global_lobby"
                    assert notice["conversation_id"] == "d1"
                tx = confirmed[0]["payload"]["transaction"]
                assert confirmed[1]["payload"]["transaction"] == tx
                assert (tx["buyer"], tx["seller"], tx["amount"]) == ("alice", "bob", "15.00")
                # Each party's own node lists it, once.
                assert await transactions(alice) == [tx]
                assert await transactions(bob) == [tx]
                # The dialogue is over: a further move made on b is refused on a.
                await send(
                    bob, "alice", "PROPOSE", proposal(9), conversation_id="d1", in_reply_to="m6"
                )
                assert (await reply(bob.ws))["payload"]["code"] == "invalid_dialogue"
            # Every move was stored once, by its receiver's home.
            assert {"m1", "m3", "m5"} <= await journaled_ids(nats, "b")
            assert {"m2", "m4", "m6"} <= await journaled_ids(nats, "a")
            assert not {"m2", "m4", "m6"} & await journaled_ids(nats, "b")
        finally:
            stop(a)
            stop(b)


def order(total: int) -> dict[str, Any]:
    item = {"id": "i1", "name": "pizza", "price": total, "quantity": 1}
    return {"items": [item], "total_price": total}


async def test_a_proposal_is_paid_once_whichever_node_its_payments_come_through(
    tmp_path: Path,
) -> None:
    """Sam (on a) makes an order proposal to Bea (on b). Bea's payments are checked on a,
    where the proposal lives: a wrong amount is refused, a right one confirmed to both. Then a
    second proposal is paid twice at once: once through b, and again through a, where Bea
    resumes without waiting for the first answer. One payment wins; the other is refused."""
    async with nats_server(tmp_path) as nats:
        a, b = node(tmp_path / "a", nats, "a"), node(tmp_path / "b", nats, "b")
        try:
            async with agent(a, "sam", acks=False, capabilities=TRADES) as sam:
                async with agent(b, "bea", acks=False, capabilities=TRADES) as bea:
                    await sam.until_discovered({"bea": ["trade"]})
                    for proposal_id in ("o1", "o2"):
                        await send(sam, "bea", "ORDER_PROPOSAL", order(12), message_id=proposal_id)
                        offered = await reply(bea.ws)
                        assert (offered["message_type"], offered["message_id"]) == (
                            "ORDER_PROPOSAL",
                            proposal_id,
                        )
                    pay = {"proposal_message_id": "o1", "amount": 11}
                    await send(bea, "sam", "PAYMENT", pay, message_id="p0")
                    wrong = await reply(bea.ws)
                    assert wrong["payload"]["code"] == "invalid_payment"
                    assert "wrong_amount" in wrong["payload"]["error"]
                    await send(bea, "sam", "PAYMENT", {**pay, "amount": 12}, message_id="p1")
                    paid = await reply(sam.ws)
                    assert (paid["message_type"], paid["message_id"]) == ("PAYMENT", "p1")
                    confirmed = [await reply(sam.ws), await reply(bea.ws)]
                    assert [c["message_type"] for c in confirmed] == ["PAYMENT_CONFIRMED"] * 2
                    tx = confirmed[0]["payload"]["transaction"]
                    assert confirmed[1]["payload"]["transaction"] == tx
                    assert (tx["buyer"], tx["seller"], tx["amount"]) == ("bea", "sam", "12.00")
                    assert await transactions(bea) == [tx]
                    # o2, paid through b ...
                    twice = {"proposal_message_id": "o2", "amount": 12}
                    await send(bea, "sam", "PAYMENT", twice, message_id="p2")
                    token = bea.token
                # ... and at once through a, where Bea resumes.
                async with connect(a.url) as ws:
                    await ws.send(frame("bea", "REGISTER", {"acks": False}, auth_token=token))
                    assert (await reply(ws))["message_type"] == "REGISTER_ACK"
                    await send(Agent(ws, "bea", token), "sam", "PAYMENT", twice, message_id="p3")
                    won = await reply(sam.ws)
                    assert won["message_type"] == "PAYMENT"
                    assert won["message_id"] in {"p2", "p3"}
                    second = await reply(sam.ws)
                    assert second["message_type"] == "PAYMENT_CONFIRMED"
                    if won["message_id"] == "p2":  # then p3, made here, is refused here
                        refused = await reply(ws)
                        while refused["message_type"] != "ERROR":
                            refused = await reply(ws)  # the confirmation of p2
                        assert refused["in_reply_to"] == "p3"
                        assert "already_paid" in refused["payload"]["error"]
                    trades = await transactions(sam)
                    assert [t["reference"] for t in trades] == ["o1", "o2"]
        finally:
            stop(a)
            stop(b)
