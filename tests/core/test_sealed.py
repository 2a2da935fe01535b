"""Sealed rounds through the Router, synchronously: held bids, the reveal, late bids, the round's
bound and refusals, and a restore from the journal (lobby/core/sealed.py)."""

from __future__ import annotations

from typing import Any

from lobby.core import Router
from lobby.core.limits import Limits
from lobby.core.records import Snapshot, StateRemoved, StateSaved
from protocol.fipa import reveal_order
from tests.routerkit import Clock, Peer, cap, join, make_router, world


def market(clock: Clock, sellers: int = 3, **options: Any) -> tuple[Any, Peer, list[Peer]]:
    router = make_router(clock, **options)
    buyer = join(router, "buyer")
    bidders = [join(router, f"s{i}", capabilities=[cap("sell")]) for i in range(sellers)]
    return router, buyer, bidders


def open_round(buyer: Peer, receivers: list[str] | None = None, **payload: Any) -> None:
    body: dict[str, Any] = {"query": {"goods": "apples"}, "sealed": {"reply_by": 10}, **payload}
    if receivers is not None:
        body["receivers"] = receivers
    buyer.send("CFP", body, conversation_id="r1", message_id="cfp-1")


def bid(seller: Peer, price: int) -> None:
    cfp = next(m for m in seller.take() if m["message_type"] == "CFP")
    seller.to(
        "buyer",
        "PROPOSE",
        {"proposal": {"price": price}},
        conversation_id=cfp["conversation_id"],
        in_reply_to=cfp["message_id"],
        message_id=f"bid-{seller.agent_id}",
    )


def test_bids_are_held_until_every_receiver_answered_then_revealed_together() -> None:
    clock = Clock()
    _, buyer, sellers = market(clock)
    open_round(buyer, ["s0", "s1", "s2"])
    (cfp,) = sellers[0].take()
    sellers[0].inbox.append(cfp)
    assert cfp["conversation_id"] == "r1:s0"
    assert cfp["payload"]["sealed"] == {"reply_by": 10, "round_id": "r1"}
    bid(sellers[0], 30)
    bid(sellers[1], 20)
    assert buyer.take() == []  # held: the buyer sees nothing yet
    declined = next(m for m in sellers[2].take() if m["message_type"] == "CFP")
    sellers[2].to(
        "buyer",
        "DECLINE",
        {"reason": "sold out"},
        conversation_id=declined["conversation_id"],
        in_reply_to=declined["message_id"],
    )
    (revealed,) = buyer.take()
    payload = revealed["payload"]
    assert revealed["message_type"] == "BIDS_REVEALED"
    assert revealed["conversation_id"] == "r1"
    order = [b["sender_id"] for b in payload["bids"]]
    assert order == reveal_order(payload["seed"], ["s0", "s1"])
    declines = [{"dialogue_id": "r1:s2", "sender_id": "s2", "reason": "sold out"}]
    assert payload["declined"] == declines
    assert payload["unanswered"] == []
    # The buyer answers each bid as in any dialogue; the lobby confirms the trade.
    buyer.to("s1", "ACCEPT", {}, conversation_id="r1:s1", in_reply_to="bid-s1")
    assert [m["message_type"] for m in sellers[1].take()] == ["ACCEPT"]


def test_the_deadline_reveals_what_came_and_refuses_a_late_bid() -> None:
    clock = Clock()
    router, buyer, sellers = market(clock)
    open_round(buyer, capability_name="sell")
    bid(sellers[0], 30)
    clock.now += 10
    assert buyer.take() == []
    late = next(m for m in sellers[1].take() if m["message_type"] == "CFP")
    sellers[1].to(
        "buyer",
        "PROPOSE",
        {"proposal": {"price": 1}},
        conversation_id=late["conversation_id"],
        in_reply_to=late["message_id"],
    )
    (error,) = sellers[1].take()
    assert error["payload"]["code"] == "invalid_dialogue"
    assert "sealed_reply_by_passed" in error["payload"]["error"]
    assert "deadline" in error["payload"]["error"]
    world.deliver(router.tick())
    (revealed,) = buyer.take()
    assert [b["sender_id"] for b in revealed["payload"]["bids"]] == ["s0"]
    assert revealed["payload"]["unanswered"] == ["s1", "s2"]
    assert [m["message_type"] for m in sellers[2].take()] == ["CFP", "DIALOGUE_EXPIRED"]


def test_the_buyer_cannot_move_in_a_held_dialogue() -> None:
    clock = Clock()
    _, buyer, sellers = market(clock, sellers=2)
    open_round(buyer, ["s0", "s1"])
    bid(sellers[0], 30)
    buyer.to("s0", "ACCEPT", {}, conversation_id="r1:s0", in_reply_to="bid-s0")
    (error,) = buyer.take()
    assert "proposal_held" in error["payload"]["error"]
    assert sellers[0].take() == []


def test_bad_rounds_are_refused_and_change_nothing() -> None:
    clock = Clock()
    router, buyer, _ = market(clock, sellers=2)
    cases: list[tuple[dict[str, Any], str, str]] = [
        ({"receivers": ["s0", "s1"]}, "invalid_dialogue", "'sealed'"),
        ({"receivers": ["s0", "s0"], "sealed": {"reply_by": 5}}, "invalid_dialogue", "distinct"),
        ({"receivers": ["s0", "nobody"], "sealed": {"reply_by": 5}}, "unknown_receiver", "nobody"),
        ({"capability_name": "fly", "sealed": {"reply_by": 5}}, "unknown_receiver", "'fly'"),
        ({"receivers": [], "sealed": {"reply_by": 5}}, "invalid_dialogue", "non-empty"),
    ]
    for payload, code, words in cases:
        buyer.send("CFP", {"query": {}, **payload}, conversation_id="r9")
        (error,) = buyer.take()
        assert error["payload"]["code"] == code, payload
        assert words in error["payload"]["error"]
    assert router.negotiations.dialogues == {}
    assert router.negotiations.sealed.rounds == {}


def test_a_round_counts_toward_the_open_dialogue_bound() -> None:
    limits = Limits(message_rate=0, registration_rate=0, discover_rate=0, max_open_dialogues=2)
    router = Router(limits=limits, clock=Clock())
    buyer = join(router, "buyer")
    for name in ("s0", "s1", "s2"):
        join(router, name)
    open_round(buyer, ["s0", "s1", "s2"])
    (error,) = buyer.take()
    assert error["payload"]["code"] == "limit_exceeded"
    assert "round of 3" in error["payload"]["error"]
    assert router.negotiations.started == {}


def test_a_restored_round_keeps_its_held_bids_and_deadline() -> None:
    clock = Clock()
    router, buyer, sellers = market(clock, sellers=2)
    open_round(buyer, ["s0", "s1"])
    bid(sellers[0], 30)
    # Keep each (kind, key)'s latest document, as a store does.
    latest: dict[tuple[str, str], bytes] = {}
    for record in router.take_journal().records:
        if isinstance(record, StateSaved):
            latest[(record.kind, record.key)] = record.data
    snapshot = Snapshot()
    for (kind, _), data in latest.items():
        snapshot.state.setdefault(kind, []).append(data)
    restored = make_router(clock)
    restored.restore(snapshot)
    sealed = restored.negotiations.sealed
    assert sealed.waiting == {"r1": 1}
    assert restored.negotiations.dialogues["r1:s0"].state == "proposal_held"
    clock.now += 10
    restored.tick()
    assert sealed.rounds["r1"].revealed_at == clock.now
    assert restored.negotiations.dialogues["r1:s0"].state == "proposal_revealed"


def test_a_resent_cfp_or_bid_is_confirmed_and_changes_nothing() -> None:
    clock = Clock()
    router, buyer, sellers = market(clock, sellers=2)
    open_round(buyer, ["s0", "s1"])
    open_round(buyer, ["s0", "s1"])  # the same message_id: a resend
    assert buyer.take() == []
    (cfp,) = sellers[0].take()  # one CFP each
    assert [m["message_type"] for m in sellers[1].take()] == ["CFP"]
    for _ in range(2):
        sellers[0].to(
            "buyer",
            "PROPOSE",
            {"proposal": {"price": 3}},
            conversation_id=cfp["conversation_id"],
            in_reply_to=cfp["message_id"],
            message_id="bid-s0",
        )
    assert sellers[0].take() == []
    assert buyer.take() == []
    assert router.negotiations.sealed.waiting == {"r1": 1}


def test_a_revealed_round_is_forgotten_after_the_dedupe_horizon() -> None:
    clock = Clock()
    router, buyer, sellers = market(clock, sellers=1, dedupe_horizon=60.0)
    open_round(buyer, ["s0"])
    bid(sellers[0], 5)
    assert buyer.last()["message_type"] == "BIDS_REVEALED"
    router.take_journal()
    clock.now += 61
    router.tick()
    assert router.negotiations.sealed.rounds == {}
    removed = [r for r in router.take_journal().records if isinstance(r, StateRemoved)]
    assert StateRemoved("sealed_round", "r1") in removed
