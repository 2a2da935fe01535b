"""Sealed rounds through the Router, synchronously: held bids, the reveal, late bids, the round's
bound and refusals, and a restore from the journal (lobby/core/commerce/sealed.py)."""

from __future__ import annotations

from typing import Any

import orjson

from lobby.core import Router
from lobby.core.limits import Limits
from lobby.core.records import Effect, MessageStored, Snapshot, StateRemoved, StateSaved
from lobby.core.refusal import unknown_receiver
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
    assert "round_not_revealed" in error["payload"]["error"]
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


# Each rule of a round one by one: what a CFP opens, each refusal word for word, the reveal's
# notices and records, the deadline and the horizon at their boundaries, a restore.


def refused(buyer: Peer, payload: dict[str, Any], **envelope: Any) -> dict[str, Any]:
    """Send a sealed CFP as `r9` and return the ERROR's payload."""
    buyer.send("CFP", payload, conversation_id="r9", **envelope)
    (error,) = buyer.take()
    assert error["message_type"] == "ERROR"
    payload = error["payload"]
    assert isinstance(payload, dict)
    return payload


def test_a_round_sends_each_receiver_its_cfp_and_opens_its_sealed_dialogue() -> None:
    clock = Clock()
    router, buyer, sellers = market(clock, sellers=2)
    router.take_journal()
    traced = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    body = {"query": {"goods": "apples"}, "sealed": {"reply_by": 10}, "receivers": ["s1", "s0"]}
    buyer.send("CFP", body, conversation_id="r1", message_id="cfp-1", traceparent=traced)
    for seller in sellers:
        (cfp,) = seller.take()
        assert {k: cfp[k] for k in ("sender_id", "receiver_id", "message_type")} == {
            "sender_id": "buyer",
            "receiver_id": seller.agent_id,
            "message_type": "CFP",
        }
        assert (cfp["conversation_id"], cfp["message_id"]) == (f"r1:{seller.agent_id}", "cfp-1")
        assert cfp["payload"] == {
            "query": {"goods": "apples"},
            "reply_by": 10,
            "sealed": {"reply_by": 10, "round_id": "r1"},
        }
        assert cfp["traceparent"].split("-")[1] == traced.split("-")[1]
        dialogue = router.negotiations.dialogues[f"r1:{seller.agent_id}"]
        assert (dialogue.initiator, dialogue.responder) == ("buyer", seller.agent_id)
        assert (dialogue.state, dialogue.reply_by) == ("cfp_sealed", None)
        assert (dialogue.round_id, dialogue.sealed_by) == ("r1", clock.now + 10)
    records = router.take_journal().records
    stored = [r for r in records if isinstance(r, MessageStored)]
    assert [(r.receiver, r.message_id, r.effect, r.at) for r in stored] == [
        ("s1", "cfp-1", Effect.NONE, clock.now),
        ("s0", "cfp-1", Effect.NONE, clock.now),
    ]
    assert list(router.negotiations.open) == ["r1:s1", "r1:s0"]
    assert router.negotiations.started == {"buyer": 2}
    sealed = router.negotiations.sealed
    assert sealed.waiting == {"r1": 2}
    (saved,) = [
        orjson.loads(r.data)
        for r in records
        if isinstance(r, StateSaved) and r.kind == "sealed_round"
    ]
    assert saved == {
        "round_id": "r1",
        "buyer": "buyer",
        "receivers": ["s1", "s0"],
        "reply_by": clock.now + 10,
        "seed": sealed.rounds["r1"].seed,
        "created_at": clock.now,
        "revealed_at": None,
        "declined": {},
    }
    assert len(saved["seed"]) == 32
    int(saved["seed"], 16)  # hex


def test_acknowledging_parties_are_confirmed_in_their_trace_and_a_resend_is_not_routed() -> None:
    clock = Clock()
    router = make_router(clock)
    buyer = join(router, "buyer", acks=True)
    seller = join(router, "s0", acks=True)
    traced = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    body = {"query": {}, "sealed": {"reply_by": 10}, "receivers": ["s0"]}
    buyer.send("CFP", body, conversation_id="r1", message_id="cfp-1", traceparent=traced)
    world.deliver(router.committed(router.take_journal()))
    (accepted,) = buyer.take()
    assert (accepted["message_type"], accepted["payload"]) == (
        "ACCEPTED",
        {"message_id": "cfp-1"},
    )
    assert accepted["traceparent"].split("-")[1] == traced.split("-")[1]
    assert router.state.delivery.seen[("buyer", "cfp-1")] == clock.now
    buyer.send("CFP", body, conversation_id="r1", message_id="cfp-1")
    (cfp,) = seller.take()
    assert cfp["message_type"] == "CFP"
    other = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    clock.now += 1
    seller.to(
        "buyer",
        "PROPOSE",
        {"proposal": {}},
        conversation_id="r1:s0",
        in_reply_to="cfp-1",
        message_id="bid",
        traceparent=other,
    )
    world.deliver(router.committed(router.take_journal()))
    confirmed = seller.take()[0]
    assert (confirmed["message_type"], confirmed["payload"]) == ("ACCEPTED", {"message_id": "bid"})
    assert confirmed["traceparent"].split("-")[1] == other.split("-")[1]
    assert router.state.delivery.seen[("s0", "bid")] == clock.now


def test_a_capability_name_asks_every_other_provider_in_id_order() -> None:
    clock = Clock()
    router = make_router(clock)
    buyer = join(router, "buyer", capabilities=[cap("sell")])
    for name in ("s2", "s0", "s1"):
        join(router, name, capabilities=[cap("sell")])
    join(router, "idle", capabilities=[cap("buy")])
    open_round(buyer, capability_name="sell")
    assert router.negotiations.sealed.rounds["r1"].receivers == ["s0", "s1", "s2"]


def test_receivers_named_win_over_a_capability_name() -> None:
    clock = Clock()
    router, buyer, _ = market(clock)
    open_round(buyer, ["s1"], capability_name="sell")
    assert router.negotiations.sealed.rounds["r1"].receivers == ["s1"]


def test_a_round_nobody_else_can_answer_is_refused_with_its_sentence() -> None:
    clock = Clock()
    router = make_router(clock)
    buyer = join(router, "buyer", capabilities=[cap("sell")])
    sealed = {"reply_by": 5}
    assert refused(buyer, {"query": {}, "capability_name": "sell", "sealed": sealed}) == {
        "error": "no other agent offers capability 'sell'; the CFP reached nobody",
        "code": "unknown_receiver",
        "original_message_type": "CFP",
        "original_conversation_id": "r9",
    }
    # A capability_name that is no string names nobody: the receivers are missing.
    error = refused(buyer, {"query": {}, "capability_name": 5, "sealed": sealed})
    assert error["error"] == (
        "a sealed CFP needs 'receivers': a non-empty list of agent ids (rule: bad_payload)"
    )
    assert router.negotiations.sealed.rounds == {}


def test_each_bad_round_is_refused_with_its_sentence_and_changes_nothing() -> None:
    clock = Clock()
    router, buyer, sellers = market(clock, sellers=2)
    router.take_journal()
    sealed = {"reply_by": 5}
    cases: list[tuple[dict[str, Any], dict[str, Any], str, str]] = [
        (
            {"receivers": ["s0"], "query": {}},
            {},
            "invalid_dialogue",
            "a CFP to several receivers needs 'sealed': {'reply_by': positive seconds} "
            "(rule: bad_payload)",
        ),
        (
            {"receivers": ["s0", "ghost"], "query": {}, "sealed": sealed},
            {},
            "unknown_receiver",
            unknown_receiver("ghost"),
        ),
        (
            {"receivers": ["s0", "s1"], "query": "apples", "sealed": sealed},
            {},
            "invalid_dialogue",
            "a CFP payload needs an object 'query' (rule: bad_payload)",
        ),
        (
            {"receivers": ["s0", "s1"], "query": {"role": "broker"}, "sealed": sealed},
            {},
            "invalid_dialogue",
            "the CFP query's 'role' must be 'buyer' or 'seller' (rule: bad_payload)",
        ),
        (
            {"receivers": ["s0", "s1"], "query": {}, "sealed": sealed},
            {"in_reply_to": "m0"},
            "invalid_dialogue",
            "a CFP starts a dialogue and replies to no move (rule: first_move_must_be_cfp)",
        ),
        (
            {"receivers": ["s0", "s1"], "query": {}, "sealed": {"reply_by": 1e300}},
            {},
            "invalid_dialogue",
            "a sealed round stays open at most 86400 seconds (24 h); its 'sealed' 'reply_by' "
            "asks for longer (rule: bad_payload)",
        ),
    ]
    for payload, envelope, code, sentence in cases:
        error = refused(buyer, payload, **envelope)
        assert (error["code"], error["error"]) == (code, sentence), payload
    assert router.negotiations.dialogues == {}
    assert router.negotiations.started == {}
    assert router.negotiations.sealed.rounds == {}
    assert router.negotiations.sealed.waiting == {}
    assert [s.take() for s in sellers] == [[], []]
    assert [r for r in router.take_journal().records if isinstance(r, StateSaved)] == []


def test_a_conversation_id_naming_a_round_or_one_of_its_dialogues_is_refused() -> None:
    clock = Clock()
    router, buyer, sellers = market(clock, sellers=2)
    open_round(buyer, ["s0", "s1"])
    for seller in sellers:
        seller.take()
    buyer.send(
        "CFP",
        {"query": {}, "sealed": {"reply_by": 5}, "receivers": ["s1"]},
        conversation_id="r1",
        message_id="cfp-2",
    )
    (error,) = buyer.take()
    assert (error["payload"]["code"], error["payload"]["error"]) == (
        "invalid_dialogue",
        "CFP refused: conversation_id 'r1' already names a sealed round "
        "(rule: conversation_id_in_use)",
    )
    # A plain dialogue named like a round's own: the round would reuse its id.
    buyer.to("s0", "CFP", {"query": {}}, conversation_id="r2:s0")
    sellers[0].take()
    buyer.send(
        "CFP",
        {"query": {}, "sealed": {"reply_by": 5}, "receivers": ["s1", "s0"]},
        conversation_id="r2",
    )
    (error,) = buyer.take()
    assert (error["payload"]["code"], error["payload"]["error"]) == (
        "invalid_dialogue",
        "CFP refused: dialogue 'r2:s0' exists already (rule: conversation_id_in_use)",
    )
    assert [s.take() for s in sellers] == [[], []]
    assert list(router.negotiations.sealed.rounds) == ["r1"]
    assert router.negotiations.started == {"buyer": 3}


def test_a_receiver_with_a_full_mailbox_refuses_the_whole_round() -> None:
    clock = Clock()
    router = make_router(clock, mailbox_limit=2)
    buyer = join(router, "buyer")
    first, full = join(router, "s0"), join(router, "s1", acks=True)
    buyer.to("s1", "TEXT", {"content": "one"})
    open_round(buyer, ["s0", "s1"])  # one held of two: room for the CFP
    assert [m["message_type"] for m in full.take()] == ["TEXT", "CFP"]
    assert [m["message_type"] for m in first.take()] == ["CFP"]
    buyer.send(
        "CFP",
        {"query": {}, "sealed": {"reply_by": 5}, "receivers": ["s0", "s1"]},
        conversation_id="r2",
        message_id="cfp-2",
    )
    (error,) = buyer.take()
    assert (error["payload"]["code"], error["payload"]["error"]) == (
        "mailbox_full",
        "agent 's1' already holds 2 undelivered messages; the sealed CFP reached nobody",
    )
    assert first.take() == []
    assert list(router.negotiations.sealed.rounds) == ["r1"]


def test_a_round_may_fill_the_open_dialogue_bound_exactly_but_not_pass_it() -> None:
    limits = Limits(message_rate=0, registration_rate=0, discover_rate=0, max_open_dialogues=3)
    router = Router(limits=limits, clock=Clock())
    buyer = join(router, "buyer")
    for name in ("s0", "s1", "s2"):
        join(router, name)
    fresh = join(router, "fresh")
    body = {"query": {}, "sealed": {"reply_by": 5}, "receivers": ["s0", "s1", "s2"]}
    fresh.send("CFP", body, conversation_id="r0")  # 0 + 3 = 3: allowed
    buyer.to("s0", "CFP", {"query": {}}, conversation_id="plain")
    open_round(buyer, ["s1", "s2"])  # 1 + 2 = 3: allowed
    assert router.negotiations.started == {"fresh": 3, "buyer": 3}
    assert fresh.take() == []
    buyer.take()
    buyer.send(
        "CFP", {"query": {}, "sealed": {"reply_by": 5}, "receivers": ["s0"]}, conversation_id="r2"
    )
    (error,) = buyer.take()
    assert (error["payload"]["code"], error["payload"]["error"]) == (
        "limit_exceeded",
        "agent 'buyer' has 3 open dialogues it started; a round of 1 more would pass 3: "
        "this CFP was not routed",
    )


def test_without_a_bound_a_round_of_any_size_opens() -> None:
    limits = Limits(message_rate=0, registration_rate=0, discover_rate=0, max_open_dialogues=0)
    router = Router(limits=limits, clock=Clock())
    buyer = join(router, "buyer")
    names = [f"s{i}" for i in range(5)]
    for name in names:
        join(router, name)
    open_round(buyer, names)
    assert router.negotiations.started == {"buyer": 5}


def test_a_decline_is_noted_and_saved_but_its_dialogue_stays_open_until_the_reveal() -> None:
    clock = Clock()
    router, buyer, sellers = market(clock, sellers=2)
    open_round(buyer, ["s0", "s1"])
    router.take_journal()
    (cfp,) = sellers[1].take()
    clock.now += 1
    sellers[1].to(
        "buyer",
        "DECLINE",
        {"reason": "sold out"},
        conversation_id="r1:s1",
        in_reply_to=cfp["message_id"],
        message_id="no-1",
    )
    assert buyer.take() == []
    negotiations = router.negotiations
    # Still counted open for the buyer (and in the lobby's metrics): neither may tell a
    # DECLINE from silence before the reveal.
    assert negotiations.dialogues["r1:s1"].state == "decline_held"
    assert list(negotiations.open) == ["r1:s0", "r1:s1"]
    assert negotiations.started == {"buyer": 2}
    assert negotiations.ended == {}
    assert negotiations.sealed.rounds["r1"].declined == {"s1": "sold out"}
    assert negotiations.sealed.waiting == {"r1": 1}
    records = router.take_journal().records
    saved = [(r.kind, r.key) for r in records if isinstance(r, StateSaved)]
    assert saved == [("sealed_round", "r1"), ("dialogue", "r1:s1")]
    assert ("s1", "no-1") in router.state.delivery.seen
    clock.now += 9
    world.deliver(router.tick())
    assert negotiations.dialogues["r1:s1"].state == "declined"
    assert negotiations.ended == {"r1:s0": clock.now, "r1:s1": clock.now}
    assert (negotiations.open, negotiations.started) == ({}, {})


def test_a_held_bid_resent_by_an_acknowledging_seller_is_confirmed_again() -> None:
    clock = Clock()
    router = make_router(clock)
    buyer = join(router, "buyer")
    sellers = [join(router, name, acks=True) for name in ("s0", "s1")]
    open_round(buyer, ["s0", "s1"])
    bid(sellers[0], 30)
    world.deliver(router.committed(router.take_journal()))
    assert [m["payload"] for m in sellers[0].take()] == [{"message_id": "bid-s0"}]
    # A resend the dedupe window no longer knows (as after a restart): confirmed, not moved.
    del router.state.delivery.seen[("s0", "bid-s0")]
    sellers[0].to(
        "buyer",
        "PROPOSE",
        {"proposal": {"price": 99}},
        conversation_id="r1:s0",
        in_reply_to="cfp-1",
        message_id="bid-s0",
    )
    world.deliver(router.committed(router.take_journal()))
    assert [m["payload"] for m in sellers[0].take()] == [{"message_id": "bid-s0"}]
    dialogue = router.negotiations.dialogues["r1:s0"]
    assert (dialogue.last_proposal, dialogue.moves) == ({"price": 30}, 2)
    assert router.negotiations.sealed.waiting == {"r1": 1}
    # Another move in the held dialogue is refused by the rules.
    sellers[0].to(
        "buyer",
        "PROPOSE",
        {"proposal": {"price": 20}},
        conversation_id="r1:s0",
        in_reply_to="bid-s0",
        message_id="bid-s0-2",
    )
    (error,) = sellers[0].take()
    assert error["payload"]["error"] == (
        "PROPOSE from the responder refused: dialogue 'r1:s0' waits for the buyer's answer "
        "to the proposal 'bid-s0' (rule: turn_taking)"
    )
    assert buyer.take() == []


def test_the_reveal_tells_the_buyer_everything_and_the_silent_their_dialogue_expired() -> None:
    clock = Clock()
    router, buyer, sellers = market(clock, sellers=4)
    open_round(buyer, ["s0", "s1", "s2", "s3"])
    start = clock.now
    bid(sellers[0], 30)
    bid(sellers[1], 20)
    (cfp,) = sellers[2].take()
    sellers[2].to("buyer", "DECLINE", {}, conversation_id="r1:s2", in_reply_to=cfp["message_id"])
    router.take_journal()
    clock.now += 9.5
    assert router.tick() == []  # before the deadline: still held
    clock.now += 0.5  # exactly at reply_by
    world.deliver(router.tick())
    (revealed,) = buyer.take()
    sealed = router.negotiations.sealed.rounds["r1"]
    assert (revealed["sender_id"], revealed["message_type"], revealed["conversation_id"]) == (
        "global_lobby",
        "BIDS_REVEALED",
        "r1",
    )
    bids = {
        "s0": {
            "dialogue_id": "r1:s0",
            "sender_id": "s0",
            "message_id": "bid-s0",
            "proposal": {"price": 30},
        },
        "s1": {
            "dialogue_id": "r1:s1",
            "sender_id": "s1",
            "message_id": "bid-s1",
            "proposal": {"price": 20},
        },
    }
    assert revealed["payload"] == {
        "round_id": "r1",
        "seed": sealed.seed,
        "reply_by": start + 10,
        "bids": [bids[b] for b in reveal_order(sealed.seed, ["s0", "s1"])],
        "declined": [{"dialogue_id": "r1:s2", "sender_id": "s2", "reason": None}],
        "unanswered": ["s3"],
    }
    notices = sellers[3].take()
    assert [(n["message_type"], n["conversation_id"]) for n in notices] == [
        ("CFP", "r1:s3"),
        ("DIALOGUE_EXPIRED", "r1:s3"),
    ]
    assert notices[1]["payload"] == {
        "dialogue_id": "r1:s3",
        "reason": "the sealed round's reply_by passed with no bid",
    }
    assert [s.take() for s in sellers[:3]] == [[], [], []]
    negotiations = router.negotiations
    states = {d: negotiations.dialogues[d].state for d in ("r1:s0", "r1:s1", "r1:s3")}
    assert states == {
        "r1:s0": "proposal_revealed",
        "r1:s1": "proposal_revealed",
        "r1:s3": "expired",
    }
    assert list(negotiations.open) == ["r1:s0", "r1:s1"]
    assert negotiations.ended == {"r1:s2": clock.now, "r1:s3": clock.now}
    assert negotiations.dialogues["r1:s2"].state == "declined"
    assert negotiations.sealed.waiting == {}
    assert negotiations.sealed.revealed == {"r1": clock.now}
    records = router.take_journal().records
    stored = [
        (r.receiver, r.conversation_id, r.at) for r in records if isinstance(r, MessageStored)
    ]
    assert stored == [("buyer", "r1", clock.now), ("s3", "r1:s3", clock.now)]
    saved = [(r.kind, r.key) for r in records if isinstance(r, StateSaved)]
    assert saved == [
        ("dialogue", "r1:s0"),
        ("dialogue", "r1:s1"),
        ("dialogue", "r1:s2"),
        ("dialogue", "r1:s3"),
        ("sealed_round", "r1"),
    ]
    document = next(r for r in records if isinstance(r, StateSaved) and r.kind == "sealed_round")
    assert orjson.loads(document.data)["revealed_at"] == clock.now
    clock.now += 5
    assert router.tick() == []  # revealed once only


def test_the_last_answer_reveals_at_once_and_the_deadline_then_does_nothing() -> None:
    clock = Clock()
    router, buyer, sellers = market(clock, sellers=2)
    open_round(buyer, ["s0", "s1"])
    bid(sellers[0], 30)
    assert buyer.take() == []
    clock.now += 2
    bid(sellers[1], 40)
    (revealed,) = buyer.take()
    assert revealed["payload"]["unanswered"] == []
    assert router.negotiations.sealed.revealed == {"r1": clock.now}
    clock.now += 10
    assert router.tick() == []
    assert buyer.take() == []


def restarted(router: Router, clock: Clock, **options: Any) -> Router:
    """A new router restored from what `router` journaled, each (kind, key)'s latest
    document kept in the order it was first saved, as a store does."""
    latest: dict[tuple[str, str], bytes] = {}
    for record in router.take_journal().records:
        if isinstance(record, StateSaved):
            latest[(record.kind, record.key)] = record.data
    snapshot = Snapshot()
    for (kind, _), data in latest.items():
        snapshot.state.setdefault(kind, []).append(data)
    restored = make_router(clock, **options)
    restored.restore(snapshot)
    return restored


def test_a_restore_waits_only_for_the_receivers_that_have_not_answered() -> None:
    clock = Clock()
    router, buyer, sellers = market(clock, sellers=3)
    open_round(buyer, ["s0", "s1", "s2"])
    bid(sellers[0], 30)
    sellers[1].to("buyer", "DECLINE", {}, conversation_id="r1:s1", in_reply_to="cfp-1")
    restored = restarted(router, clock)
    sealed = restored.negotiations.sealed
    assert sealed.waiting == {"r1": 1}
    assert sealed.revealed == {}
    assert sealed.rounds["r1"].declined == {"s1": None}
    clock.now += 9.9
    assert restored.tick() == []
    clock.now += 0.1
    restored.tick()
    assert sealed.revealed == {"r1": clock.now}
    assert sealed.waiting == {}


def test_restored_revealed_rounds_are_forgotten_in_the_order_they_were_revealed() -> None:
    clock = Clock()
    router, buyer, sellers = market(clock, sellers=2)
    # r1 opens first and is revealed last; r2 opens second and is revealed first.
    open_round(buyer, ["s0"])
    buyer.send(
        "CFP",
        {"query": {}, "sealed": {"reply_by": 10}, "receivers": ["s1"]},
        conversation_id="r2",
        message_id="cfp-2",
    )
    clock.now += 1
    bid(sellers[1], 5)
    revealed_r2 = clock.now
    clock.now += 1
    bid(sellers[0], 5)
    revealed_r1 = clock.now
    restored = restarted(router, clock, dedupe_horizon=60.0)
    sealed = restored.negotiations.sealed
    assert list(sealed.revealed.items()) == [("r2", revealed_r2), ("r1", revealed_r1)]
    assert sealed.waiting == {}
    clock.now = revealed_r2 + 60.5
    restored.tick()
    assert list(sealed.rounds) == ["r1"]
    assert buyer.take()[-1]["message_type"] == "BIDS_REVEALED"
    clock.now += 20
    assert restored.tick() == []  # a restored revealed round is not revealed again


def test_a_revealed_round_is_kept_exactly_until_the_horizon() -> None:
    clock = Clock()
    router, buyer, sellers = market(clock, sellers=1, dedupe_horizon=60.0)
    open_round(buyer, ["s0"])
    bid(sellers[0], 5)
    revealed = clock.now
    router.take_journal()
    clock.now = revealed + 60
    router.tick()
    assert list(router.negotiations.sealed.rounds) == ["r1"]
    assert router.negotiations.sealed.revealed == {"r1": revealed}
    assert [r for r in router.take_journal().records if isinstance(r, StateRemoved)] == []
    clock.now += 0.5
    router.tick()
    assert router.negotiations.sealed.revealed == {}
    removed = [r for r in router.take_journal().records if isinstance(r, StateRemoved)]
    assert removed[0] == StateRemoved("sealed_round", "r1")


def test_a_traced_rounds_reveal_expiries_and_later_moves_join_the_cfps_trace() -> None:
    clock = Clock()
    router, buyer, sellers = market(clock, sellers=2)
    traced = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    body = {"query": {}, "sealed": {"reply_by": 10}, "receivers": ["s0", "s1"]}
    buyer.send("CFP", body, conversation_id="r1", message_id="cfp-1", traceparent=traced)
    bid(sellers[0], 30)  # untraced
    clock.now += 10
    world.deliver(router.tick())
    (revealed,) = buyer.take()
    assert revealed["traceparent"].split("-")[1] == traced.split("-")[1]
    expired = sellers[1].take()[-1]
    assert expired["message_type"] == "DIALOGUE_EXPIRED"
    assert expired["traceparent"].split("-")[1] == traced.split("-")[1]
    buyer.to("s0", "ACCEPT", {}, conversation_id="r1:s0", in_reply_to="bid-s0")
    accept = sellers[0].last()
    assert accept["message_type"] == "ACCEPT"
    assert accept["traceparent"].split("-")[1] == traced.split("-")[1]


def test_an_untraced_round_stays_untraced() -> None:
    clock = Clock()
    _, buyer, sellers = market(clock, sellers=1)
    open_round(buyer, ["s0"])
    bid(sellers[0], 30)
    (revealed,) = buyer.take()
    assert "traceparent" not in revealed


def test_the_deadline_of_a_round_forgotten_before_it_passes_does_nothing() -> None:
    clock = Clock()
    router, buyer, sellers = market(clock, sellers=1, dedupe_horizon=5.0)
    open_round(buyer, ["s0"])  # reply_by 10 s
    bid(sellers[0], 5)
    assert buyer.take()[-1]["message_type"] == "BIDS_REVEALED"
    clock.now += 6
    router.tick()
    assert router.negotiations.sealed.rounds == {}
    clock.now += 5
    assert router.tick() == []
    assert buyer.take() == []


def test_rounds_due_in_the_same_tick_are_all_revealed() -> None:
    clock = Clock()
    router, buyer, sellers = market(clock, sellers=2)
    open_round(buyer, ["s0"])
    body = {"query": {}, "sealed": {"reply_by": 5}, "receivers": ["s1"]}
    buyer.send("CFP", body, conversation_id="r2", message_id="cfp-2")
    clock.now += 10
    world.deliver(router.tick())
    revealed = buyer.take()
    assert [(m["message_type"], m["conversation_id"]) for m in revealed] == [
        ("BIDS_REVEALED", "r2"),
        ("BIDS_REVEALED", "r1"),
    ]
    assert [m["message_type"] for s in sellers for m in s.take()] == [
        "CFP",
        "DIALOGUE_EXPIRED",
        "CFP",
        "DIALOGUE_EXPIRED",
    ]
