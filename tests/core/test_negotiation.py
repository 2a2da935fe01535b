"""Negotiation through the Router, synchronously: FIPA dialogues, their expiry and bound, and the
settled trade in the ledger (lobby/core/commerce/negotiation.py)."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from lobby.core import Router
from lobby.core.delivery import DEFAULT_DEDUPE_HORIZON
from lobby.core.limits import Limits
from lobby.core.records import Effect, MessageStored, StateRemoved, StateSaved
from tests.core.test_sealed import bid, market, open_round
from tests.routerkit import Clock, Peer, join, make_router, world

TRACED = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def haggle_parties(clock: Clock | None = None, **router_options: Any) -> tuple[Peer, Peer, Any]:
    router = make_router(clock, **router_options)
    return join(router, "b"), join(router, "s"), router


def move(peer: Peer, to: str, kind: str, move_id: str, target: str | None, **payload: Any) -> None:
    envelope: dict[str, Any] = {"conversation_id": "d1", "message_id": move_id}
    if target is not None:
        envelope["in_reply_to"] = target
    peer.to(to, kind, payload, **envelope)


def test_the_seed_haggle_ends_in_a_confirmed_transaction() -> None:
    b, s, router = haggle_parties()
    move(b, "s", "CFP", "1", None, query={"goods": {"r": 1}})
    move(s, "b", "PROPOSE", "2", "1", proposal={"price": 20, "goods": {"r": 1}})
    move(b, "s", "PROPOSE", "3", "2", proposal={"price": 10, "goods": {"r": 1}})
    move(s, "b", "PROPOSE", "4", "3", proposal={"price": 15, "goods": {"r": 1}})
    move(b, "s", "ACCEPT", "5", "4")
    move(s, "b", "MATCH_ACCEPT", "6", "5")
    to_s = [m["message_type"] for m in s.take()]
    to_b = b.take()
    assert to_s == ["CFP", "PROPOSE", "ACCEPT", "TRANSACTION_CONFIRMED"]
    assert [m["message_type"] for m in to_b] == [
        "PROPOSE",
        "PROPOSE",
        "MATCH_ACCEPT",
        "TRANSACTION_CONFIRMED",
    ]
    tx = to_b[-1]["payload"]["transaction"]
    assert (tx["buyer"], tx["seller"], tx["amount"], tx["goods"]) == ("b", "s", "15.00", {"r": 1})
    assert tx["kind"] == "negotiation"
    assert tx["reference"] == "d1"
    assert to_b[1]["in_reply_to"] == "3"
    b.send("LIST_TRANSACTIONS", {}, conversation_id="q")
    assert b.last()["payload"]["transactions"] == [tx]
    outsider = join(router, "x")
    outsider.send("LIST_TRANSACTIONS", {})
    assert outsider.last()["payload"]["transactions"] == []


@pytest.mark.parametrize(
    ("sender", "kind", "move_id", "target", "payload", "rule"),
    [
        ("s", "ACCEPT", "2", "1", {}, "invalid_reply"),
        ("b", "PROPOSE", "2", "1", {"proposal": {}}, "turn_taking"),
        ("s", "PROPOSE", "2", "nope", {"proposal": {}}, "reply_to_latest_move"),
        ("s", "CFP", "2", None, {"query": {}}, "conversation_id_in_use"),
    ],
)
def test_an_illegal_move_is_refused_and_never_delivered(
    sender: str, kind: str, move_id: str, target: str | None, payload: dict[str, Any], rule: str
) -> None:
    b, s, _ = haggle_parties()
    move(b, "s", "CFP", "1", None, query={})
    s.take()
    peer, other = (b, s) if sender == "b" else (s, b)
    move(peer, other.agent_id, kind, move_id, target, **payload)
    error = peer.last()
    assert error["message_type"] == "ERROR"
    assert error["payload"]["code"] == "invalid_dialogue"
    assert f"rule: {rule}" in error["payload"]["error"]
    assert other.take() == []


def test_a_third_agent_cannot_move_in_a_dialogue() -> None:
    b, _, router = haggle_parties()
    move(b, "s", "CFP", "1", None, query={})
    mallory = join(router, "mallory")
    move(mallory, "b", "PROPOSE", "2", "1", proposal={"price": 1})
    assert "rule: not_a_party" in mallory.last()["payload"]["error"]
    assert b.take() == []


def test_a_cfp_deadline_expires_the_dialogue_for_both() -> None:
    clock = Clock()
    b, s, router = haggle_parties(clock)
    move(b, "s", "CFP", "1", None, query={}, reply_by=5)
    s.take()
    clock.now += 4
    assert router.tick() == []
    clock.now += 2
    world.deliver(router.tick())
    for peer in (b, s):
        notice = peer.last()
        assert notice["message_type"] == "DIALOGUE_EXPIRED"
        assert notice["payload"]["dialogue_id"] == "d1"
    move(s, "b", "PROPOSE", "2", "1", proposal={})
    assert "rule: dialogue_over" in s.last()["payload"]["error"]


def test_an_idle_dialogue_expires_after_the_timeout() -> None:
    clock = Clock()
    b, _, router = haggle_parties(clock, dialogue_timeout=60)
    move(b, "s", "CFP", "1", None, query={})
    clock.now += 61
    actions = router.tick()
    assert len(actions) == 2
    assert "d1" not in router.negotiations.open


def test_open_dialogues_an_agent_started_are_bounded() -> None:
    clock = Clock()
    router = Router(
        limits=Limits(message_rate=0, registration_rate=0, max_open_dialogues=1), clock=clock
    )
    b, s = join(router, "b"), join(router, "s")
    b.to("s", "CFP", {"query": {}, "reply_by": 5}, conversation_id="d1", message_id="1")
    assert s.take()[0]["message_type"] == "CFP"
    b.to("s", "CFP", {"query": {}}, conversation_id="d2", message_id="2")
    refused = b.last()
    assert refused["payload"]["code"] == "limit_exceeded"
    assert s.take() == []
    s.to("b", "CFP", {"query": {}}, conversation_id="d3", message_id="3")  # s has its own
    assert b.take()[0]["message_type"] == "CFP"
    clock.now += 6
    world.deliver(router.tick())  # d1 expires: b may start another
    b.take()
    b.to("s", "CFP", {"query": {}}, conversation_id="d2", message_id="2")
    assert [m["message_type"] for m in s.take()] == ["DIALOGUE_EXPIRED", "CFP"]


def test_a_dialogue_with_moves_expires_only_after_its_last_move_idles() -> None:
    clock = Clock()
    b, s, router = haggle_parties(clock, dialogue_timeout=10)
    move(b, "s", "CFP", "1", None, query={})
    clock.now += 8
    move(s, "b", "PROPOSE", "2", "1", proposal={"price": 5})
    clock.now += 4  # 12 s after the CFP, 4 after the last move
    assert router.tick() == []
    assert "d1" in router.negotiations.open
    clock.now += 7  # 11 s after the last move
    assert len(router.tick()) == 2
    assert "d1" not in router.negotiations.open


def test_a_settled_trade_is_stored_with_its_id_in_the_dialogue_and_notified_in_it() -> None:
    clock = Clock()
    b, s, router = haggle_parties(clock)
    move(b, "s", "CFP", "1", None, query={"goods": {"r": 1}})
    move(s, "b", "PROPOSE", "2", "1", proposal={"price": 15, "goods": {"r": 1}})
    router.take_journal()
    clock.now += 7
    move(b, "s", "ACCEPT", "3", "2")
    move(s, "b", "MATCH_ACCEPT", "4", "3")
    tx = b.last()["payload"]["transaction"]
    assert tx["transaction_id"].startswith("tx-")
    records = router.take_journal().records
    dialogue = [r for r in records if isinstance(r, StateSaved) and r.kind == "dialogue"][-1]
    assert orjson.loads(dialogue.data)["transaction_id"] == tx["transaction_id"]
    notices = [r for r in records if isinstance(r, MessageStored) and r.sender == "global_lobby"]
    assert [(r.receiver, r.conversation_id, r.at, r.effect) for r in notices] == [
        ("b", "d1", clock.now, Effect.NONE),
        ("s", "d1", clock.now, Effect.NONE),
    ]
    for peer in (b, s):
        notice = peer.last()
        assert (notice["receiver_id"], notice["conversation_id"]) == (peer.agent_id, "d1")


def test_a_dialogue_expires_only_once_its_deadline_is_past() -> None:
    clock = Clock()
    b, s, router = haggle_parties(clock)
    move(b, "s", "CFP", "1", None, query={}, reply_by=5)
    s.take()
    clock.now += 5  # exactly at reply_by: still open
    assert router.tick() == []
    assert "d1" in router.negotiations.open


def test_dialogues_due_together_all_expire_each_with_its_reason_saved_and_forgotten_later() -> None:
    clock = Clock()
    b, s, router = haggle_parties(clock, dialogue_timeout=10)
    start = clock.now
    b.to(
        "s",
        "CFP",
        {"query": {}, "reply_by": 5},
        conversation_id="late",
        message_id="1",
        traceparent=TRACED,
    )
    b.to("s", "CFP", {"query": {}}, conversation_id="idle", message_id="2")
    # Idle at 10 s, its reply_by at 11: at 11 it has idled (the deadline is not yet past).
    b.to("s", "CFP", {"query": {}, "reply_by": 11}, conversation_id="soon", message_id="5")
    # Ended before its deadline: its entry comes due first and is passed over.
    b.to(
        "s",
        "CFP",
        {"query": {}, "reply_by": 3},
        conversation_id="over",
        message_id="3",
        traceparent="00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
    )
    s.to("b", "DECLINE", {}, conversation_id="over", message_id="4", in_reply_to="3")
    # Moved at 5 s: its entry comes due at 10 s among the others and is put off to 15 s.
    b.to("s", "CFP", {"query": {}}, conversation_id="moved", message_id="6")
    clock.now += 5
    s.to("b", "PROPOSE", {"proposal": {}}, conversation_id="moved", message_id="7", in_reply_to="6")
    b.take()
    s.take()
    router.take_journal()
    clock.now += 6
    world.deliver(router.tick())
    expected = [
        ("late", "the CFP's reply_by passed with no reply"),
        ("idle", "no move for 10 s"),
        ("soon", "no move for 10 s"),
    ]
    for peer in (b, s):
        notices = peer.take()
        assert [(n["message_type"], n["conversation_id"]) for n in notices] == [
            ("DIALOGUE_EXPIRED", dialogue_id) for dialogue_id, _ in expected
        ]
        assert [n["payload"] for n in notices] == [
            {"dialogue_id": dialogue_id, "reason": reason} for dialogue_id, reason in expected
        ]
        assert notices[0]["traceparent"].split("-")[1] == TRACED.split("-")[1]
    records = router.take_journal().records
    stored = [r for r in records if isinstance(r, MessageStored)]
    assert {r.at for r in stored} == {clock.now}
    saved = [r for r in records if isinstance(r, StateSaved)]
    assert [(r.key, orjson.loads(r.data)["state"]) for r in saved] == [
        ("late", "expired"),
        ("idle", "expired"),
        ("soon", "expired"),
    ]
    assert {orjson.loads(r.data)["updated_at"] for r in saved} == {clock.now}
    assert set(router.negotiations.dialogues) == {"late", "idle", "soon", "over", "moved"}
    clock.now = start + DEFAULT_DEDUPE_HORIZON + 10  # "over" ended at the start, the others at 11
    router.tick()
    assert set(router.negotiations.dialogues) == {"late", "idle", "soon", "moved"}
    assert set(router.negotiations.traces) == {"late"}  # "over"'s went with it
    removed = [r for r in router.take_journal().records if isinstance(r, StateRemoved)]
    assert removed == [StateRemoved("dialogue", "over")]
    clock.now += 2
    router.tick()
    assert set(router.negotiations.dialogues) == {"moved"}


def test_a_dialogue_that_ends_frees_one_of_its_initiators_open_dialogues() -> None:
    router = Router(limits=Limits(message_rate=0, registration_rate=0, max_open_dialogues=2))
    b, s = join(router, "b"), join(router, "s")
    for dialogue_id in ("d1", "d2"):
        b.to("s", "CFP", {"query": {}}, conversation_id=dialogue_id, message_id=dialogue_id)
    s.to("b", "DECLINE", {}, conversation_id="d1", message_id="x1", in_reply_to="d1")
    b.take()
    b.to("s", "CFP", {"query": {}}, conversation_id="d3", message_id="d3")
    b.to("s", "CFP", {"query": {}}, conversation_id="d4", message_id="d4")
    assert b.last()["payload"]["error"] == (
        "agent 'b' already has 2 open dialogues it started; this CFP was not routed"
    )
    assert [m["conversation_id"] for m in s.take()] == ["d1", "d2", "d3"]
    for dialogue_id in ("d2", "d3"):
        declined = {"conversation_id": dialogue_id, "in_reply_to": dialogue_id}
        s.to("b", "DECLINE", {}, message_id=f"x-{dialogue_id}", **declined)
    assert router.negotiations.started == {}  # nothing kept for an agent with none open


def test_a_move_without_a_conversation_or_a_cfp_in_reply_is_refused_and_a_resend_ignored() -> None:
    b, s, router = haggle_parties()
    b.to("s", "CFP", {"query": {}})
    error = b.last()["payload"]
    assert (error["code"], error["error"]) == ("malformed", "a CFP needs a conversation_id")
    b.to("s", "CFP", {"query": {}}, conversation_id="d1", in_reply_to="x")
    error = b.last()["payload"]
    assert (error["code"], error["error"]) == (
        "invalid_dialogue",
        "a CFP starts a dialogue and replies to no move (rule: first_move_must_be_cfp)",
    )
    assert s.take() == []
    b.to("s", "CFP", {"query": {}}, conversation_id="d2")  # the lobby names the move
    named = s.last()["message_id"]
    s.to("b", "PROPOSE", {"proposal": {}}, conversation_id="d2", message_id="p", in_reply_to=named)
    assert b.last()["message_type"] == "PROPOSE"
    for _ in range(2):
        b.to("s", "CFP", {"query": {}}, conversation_id="d3", message_id="c3")
    assert [m["message_id"] for m in s.take()] == ["c3"]
    assert b.take() == []  # a resend is not refused
    stored = [r for r in router.take_journal().records if isinstance(r, MessageStored)]
    assert [(r.conversation_id, r.effect) for r in stored] == [
        ("d2", Effect.NONE),
        ("d2", Effect.NONE),
        ("d3", Effect.NONE),
    ]


def test_an_ended_dialogue_is_remembered_until_exactly_the_horizon_then_forgotten() -> None:
    clock = Clock()
    b, s, router = haggle_parties(clock, dedupe_horizon=100)
    b.to("s", "CFP", {"query": {}}, conversation_id="d1", message_id="c1")
    s.to("b", "DECLINE", {}, conversation_id="d1", message_id="x1", in_reply_to="c1")
    router.take_journal()
    clock.now += 100
    router.tick()
    assert "d1" in router.negotiations.dialogues  # ended exactly `remember` ago: kept
    assert router.take_journal().records == []
    clock.now += 0.5
    router.tick()
    assert "d1" not in router.negotiations.dialogues
    assert router.take_journal().records == [StateRemoved("dialogue", "d1")]


def test_a_sealed_rounds_dialogues_count_as_open_dialogues_their_buyer_started() -> None:
    router = Router(limits=Limits(message_rate=0, registration_rate=0, max_open_dialogues=3))
    buyer = join(router, "buyer")
    for seller in ("s0", "s1"):
        join(router, seller)
    round_ = {"query": {}, "receivers": ["s0", "s1"], "sealed": {"reply_by": 10}}
    buyer.send("CFP", round_, conversation_id="r1", message_id="c1")
    assert router.negotiations.started == {"buyer": 2}
    buyer.to("s0", "CFP", {"query": {}}, conversation_id="d1", message_id="c2")
    assert router.negotiations.started == {"buyer": 3}
    buyer.take()
    buyer.to("s1", "CFP", {"query": {}}, conversation_id="d2", message_id="c3")
    assert buyer.last()["payload"]["error"] == (
        "agent 'buyer' already has 3 open dialogues it started; this CFP was not routed"
    )


def test_an_agent_at_its_bound_is_refused_alike_for_a_dialogue_that_is_or_is_not() -> None:
    """`limit_exceeded` answers a CFP only: a move into a dialogue that does not exist reads
    as one into a dialogue the sender is not in."""
    limits = Limits(message_rate=0, registration_rate=0, discover_rate=0, max_open_dialogues=1)
    router = Router(limits=limits, clock=Clock())
    x, s = join(router, "x"), join(router, "s")
    join(router, "b").to("s", "CFP", {"query": {}}, conversation_id="theirs")
    x.to("s", "CFP", {"query": {}}, conversation_id="mine")  # x is at its bound
    s.take()
    errors = []
    for conversation in ("theirs", "nowhere"):
        x.to("s", "PROPOSE", {"proposal": {}}, conversation_id=conversation, message_id="p")
        errors.append(x.last()["payload"])
    assert errors == [
        {
            "error": f"PROPOSE refused: 'x' has no dialogue {conversation!r} with 's'; only a "
            "dialogue's two parties may move in it, to each other (rule: not_a_party)",
            "code": "invalid_dialogue",
            "original_message_type": "PROPOSE",
            "original_conversation_id": conversation,
        }
        for conversation in ("theirs", "nowhere")
    ]
    assert s.take() == []


def test_a_sealed_rounds_dialogue_does_not_idle_out_before_its_round_is_revealed() -> None:
    clock = Clock()
    router, buyer, sellers = market(clock, sellers=3, dialogue_timeout=10)
    open_round(buyer, ["s0", "s1", "s2"], sealed={"reply_by": 30})
    bid(sellers[0], 20)  # held until the reveal
    (cfp,) = sellers[1].take()
    sellers[1].to("buyer", "DECLINE", {}, conversation_id="r1:s1", in_reply_to=cfp["message_id"])
    clock.now += 25  # all idle past the timeout, the round still sealed
    assert router.tick() == []
    assert set(router.negotiations.open) == {"r1:s0", "r1:s1", "r1:s2"}
    clock.now += 5
    world.deliver(router.tick())  # the reveal: the bid stands, the others end
    assert set(router.negotiations.open) == {"r1:s0"}
    buyer.take()
    sellers[0].take()
    # The revealed bid idles out --dialogue-timeout after the round's deadline, not before.
    clock.now += 9.5
    assert router.tick() == []
    clock.now += 1
    world.deliver(router.tick())
    assert router.negotiations.open == {}
    for party in (buyer, sellers[0]):
        assert party.last()["payload"] == {"dialogue_id": "r1:s0", "reason": "no move for 10 s"}
