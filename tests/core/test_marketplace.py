"""The marketplace through the Router, synchronously: TEXT, order proposals and payments; what is
forwarded, what is refused, what reaches the ledger (lobby/core/commerce/marketplace.py)."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from structlog.testing import capture_logs

from lobby.core.records import Effect, MessageStored, StateSaved
from lobby.core.session import Send
from tests.core.test_delivery import restarted, resume
from tests.routerkit import Clock, Peer, join, make_router


def market() -> tuple[Peer, Peer, Peer, Any]:
    router = make_router()
    return join(router, "shop"), join(router, "alice"), join(router, "mallory"), router


ORDER = {
    "items": [
        {"id": "1", "name": "tea", "price": 0.1, "quantity": 1},
        {"id": "2", "name": "cake", "price": 0.2, "quantity": 1},
    ],
    "total_price": 0.3,
}


def propose(shop: Peer, to: str = "alice", **changes: Any) -> None:
    shop.to(to, "ORDER_PROPOSAL", {**ORDER, **changes}, message_id="p1", conversation_id="c")


def test_text_and_a_paid_proposal_end_in_payment_confirmed_for_both() -> None:
    shop, alice, _, router = market()
    alice.to("shop", "TEXT", {"content": "tea and cake?"})
    assert shop.last()["payload"] == {"content": "tea and cake?"}
    propose(shop)
    assert alice.last()["message_id"] == "p1"
    alice.to("shop", "PAYMENT", {"amount": 0.30, "proposal_message_id": "p1"}, message_id="pay1")
    to_shop = shop.take()
    assert [m["message_type"] for m in to_shop] == ["PAYMENT", "PAYMENT_CONFIRMED"]
    confirmation = alice.last()
    assert confirmation["message_type"] == "PAYMENT_CONFIRMED"
    tx = confirmation["payload"]["transaction"]
    assert (tx["buyer"], tx["seller"], tx["amount"], tx["reference"]) == (
        "alice",
        "shop",
        "0.30",
        "p1",
    )
    assert router.ledger.transactions == [tx]
    # The same PAYMENT again: the original confirmation, no second payment.
    alice.to("shop", "PAYMENT", {"amount": 0.30, "proposal_message_id": "p1"}, message_id="pay1")
    assert alice.last()["payload"]["transaction"] == tx
    assert shop.take() == []
    assert len(router.ledger.transactions) == 1


@pytest.mark.parametrize(
    ("payer", "payee", "amount", "proposal_id", "rule"),
    [
        ("mallory", "shop", 0.3, "p1", "wrong_payer"),
        ("alice", "mallory", 0.3, "p1", "wrong_payee"),
        ("alice", "shop", 0.25, "p1", "wrong_amount"),
        ("alice", "shop", 0.35, "p1", "wrong_amount"),
        ("alice", "shop", 0.3, "nope", "unknown_proposal"),
    ],
)
def test_a_wrong_payment_is_refused_and_reaches_nobody(
    payer: str, payee: str, amount: float, proposal_id: str, rule: str
) -> None:
    shop, alice, mallory, router = market()
    propose(shop)
    alice.take()
    peers = {"alice": alice, "mallory": mallory, "shop": shop}
    peers[payer].to(payee, "PAYMENT", {"amount": amount, "proposal_message_id": proposal_id})
    error = peers[payer].last()
    assert error["payload"]["code"] == "invalid_payment"
    assert f"rule: {rule}" in error["payload"]["error"]
    assert all(p.take() == [] for p in peers.values())
    assert router.ledger.transactions == []


def test_paying_twice_with_a_new_message_is_already_paid() -> None:
    shop, alice, _, _ = market()
    propose(shop)
    alice.to("shop", "PAYMENT", {"amount": 0.3, "proposal_message_id": "p1"}, message_id="a")
    alice.to("shop", "PAYMENT", {"amount": 0.3, "proposal_message_id": "p1"}, message_id="b")
    assert "rule: already_paid" in alice.last()["payload"]["error"]


def test_an_expired_proposal_cannot_be_paid() -> None:
    shop, alice, _, _ = market()
    propose(shop, expires_at="2000-01-01T00:00:00Z")
    alice.to("shop", "PAYMENT", {"amount": 0.3, "proposal_message_id": "p1"})
    assert "rule: expired" in alice.last()["payload"]["error"]


def test_a_proposal_with_a_wrong_total_is_refused() -> None:
    shop, alice, _, _ = market()
    propose(shop, total_price=0.31)
    assert "rule: total_mismatch" in shop.last()["payload"]["error"]
    assert alice.take() == []


def test_a_text_without_content_or_to_nobody_is_refused_with_its_sentence() -> None:
    shop, alice, _, _ = market()
    alice.to("shop", "TEXT", {"content": 3})
    error = alice.last()["payload"]
    assert (error["code"], error["error"]) == (
        "malformed",
        "a TEXT payload needs a string 'content'",
    )
    alice.to("nobody", "TEXT", {"content": "hi"})
    assert alice.last()["payload"]["error"] == "no agent 'nobody' is registered"
    assert shop.take() == []


def test_a_proposal_is_saved_whole_and_its_message_id_names_it_alone() -> None:
    shop, alice, _, router = market()
    shop.to("alice", "ORDER_PROPOSAL", ORDER, conversation_id="c")
    proposal = alice.last()
    assigned = proposal["message_id"]
    assert assigned  # the lobby names a proposal sent without a message_id
    saved = [r for r in router.take_journal().records if isinstance(r, StateSaved)]
    assert [(r.kind, r.key, orjson.loads(r.data)) for r in saved] == [
        ("proposal", assigned, record(assigned, paid_by=None, transaction_id=None))
    ]
    alice.to("shop", "ORDER_PROPOSAL", ORDER, conversation_id="c", message_id=assigned)
    error = alice.last()["payload"]
    assert (error["code"], error["error"]) == (
        "invalid_payment",
        f"message_id {assigned!r} already names an order proposal; give each proposal an id "
        "of its own (rule: proposal_id_in_use)",
    )
    assert shop.take() == []
    assert router.market.proposals[assigned].sender_id == "shop"


def record(message_id: str, **paid: Any) -> dict[str, Any]:
    return {
        "message_id": message_id,
        "sender_id": "shop",
        "receiver_id": "alice",
        "total_price": "0.3",
        "expires_at": None,
        **paid,
    }


def test_a_payment_saves_its_proposal_paid_and_its_transaction_and_is_logged() -> None:
    shop, alice, _, router = market()
    router.state.trace = True
    propose(shop)
    router.take_journal()
    with capture_logs() as logs:
        alice.to("shop", "PAYMENT", {"amount": 0.3, "proposal_message_id": "p1"}, **PAID)
    tx = alice.last()["payload"]["transaction"]
    assert tx["transaction_id"]
    assert tx["kind"] == "payment"
    saved = [r for r in router.take_journal().records if isinstance(r, StateSaved)]
    assert [(r.kind, r.key, orjson.loads(r.data)) for r in saved] == [
        ("proposal", "p1", record("p1", paid_by="pay1", transaction_id=tx["transaction_id"])),
        ("transaction", tx["transaction_id"], tx),
    ]
    (accepted,) = [e for e in logs if e["event"] == "PAYMENT_ACCEPTED"]
    assert accepted == {
        "event": "PAYMENT_ACCEPTED",
        "log_level": "debug",
        "payer": "alice",
        "payee": "shop",
        "amount": "0.30",
        "proposal_message_id": "p1",
        "transaction_id": tx["transaction_id"],
        "conversation_id": "c",
        "trace_id": None,
    }
    confirmed = [(m["message_type"], m["conversation_id"]) for m in shop.take()]
    assert confirmed == [("PAYMENT", "c"), ("PAYMENT_CONFIRMED", "c")]


PAID = {"message_id": "pay1", "conversation_id": "c"}


def test_after_a_restart_a_resent_payment_gets_its_original_confirmation() -> None:
    clock = Clock()
    router = make_router(clock)
    shop, alice = join(router, "shop"), join(router, "alice")
    propose(shop)
    alice.to("shop", "PAYMENT", {"amount": 0.3, "proposal_message_id": "p1"}, **PAID)
    tx = alice.last()["payload"]["transaction"]
    again = restarted(router, clock)
    shop = Peer(again, "shop", shop.session, shop.token)
    alice = Peer(again, "alice", alice.session, alice.token)
    resume(shop)
    resume(alice)
    alice.to("shop", "PAYMENT", {"amount": 0.3, "proposal_message_id": "p1"}, **PAID)
    resent = alice.last()
    assert (resent["message_type"], resent["payload"]) == ("PAYMENT_CONFIRMED", {"transaction": tx})
    alice.to("shop", "PAYMENT", {"amount": 0.3, "proposal_message_id": "p1"}, message_id="new")
    assert "rule: already_paid" in alice.last()["payload"]["error"]
    assert shop.take() == []
    assert again.ledger.transactions == [tx]


def test_a_payment_naming_its_proposal_with_no_string_is_refused() -> None:
    shop, alice, _, router = market()
    propose(shop)
    for named in (["p1"], {"id": "p1"}, 1):
        alice.to("shop", "PAYMENT", {"amount": 0.3, "proposal_message_id": named})
        error = alice.last()["payload"]
        assert (error["code"], error["error"]) == (
            "invalid_payment",
            "a PAYMENT needs a string 'proposal_message_id' (rule: bad_field)",
        )
    assert router.ledger.transactions == []


def test_a_resent_proposal_or_text_reaches_its_receiver_once() -> None:
    shop, alice, _, router = market()
    for _ in range(2):
        propose(shop)
        shop.to("alice", "TEXT", {"content": "tea?"}, message_id="t1")
    assert [m["message_id"] for m in alice.take()] == ["p1", "t1"]
    assert shop.take() == []  # a resend is not refused
    stored = [r for r in router.take_journal().records if isinstance(r, MessageStored)]
    assert [(r.message_id, r.effect) for r in stored] == [("p1", Effect.NONE), ("t1", Effect.NONE)]


def test_a_traced_payment_is_logged_in_its_trace_and_confirmed_when_made() -> None:
    clock = Clock()
    router = make_router(clock, trace=True)
    shop, alice = join(router, "shop"), join(router, "alice")
    propose(shop)
    router.take_journal()
    clock.now += 5
    traced = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    with capture_logs() as logs:
        alice.to(
            "shop",
            "PAYMENT",
            {"amount": 0.3, "proposal_message_id": "p1"},
            traceparent=traced,
            **PAID,
        )
    (accepted,) = [e for e in logs if e["event"] == "PAYMENT_ACCEPTED"]
    assert accepted["trace_id"] == "4bf92f3577b34da6a3ce929d0e0e4736"
    stored = [r for r in router.take_journal().records if isinstance(r, MessageStored)]
    assert [(r.sender, r.at) for r in stored] == [
        ("alice", clock.now),
        ("global_lobby", clock.now),
        ("global_lobby", clock.now),
    ]


def test_an_acknowledging_payers_payment_is_stored_opening_nothing_and_accepted_later() -> None:
    router = make_router()
    shop, alice = join(router, "shop"), join(router, "alice", acks=True)
    propose(shop)
    router.take_journal()
    alice.to("shop", "PAYMENT", {"amount": 0.3, "proposal_message_id": "p1"}, **PAID)
    alice.take()
    batch = router.take_journal()
    (payment,) = [r for r in batch.records if isinstance(r, MessageStored) and r.sender == "alice"]
    assert (payment.message_id, payment.effect) == ("pay1", Effect.NONE)
    (accepted,) = router.committed(batch)
    assert isinstance(accepted, Send)
    assert accepted.session is alice.session
    frame = orjson.loads(accepted.frame)
    assert (frame["message_type"], frame["payload"]) == ("ACCEPTED", {"message_id": "pay1"})
