"""Order proposal and payment rules (protocol.market), pure and synchronous."""

from __future__ import annotations

import time
from decimal import Decimal
from typing import Any

import pytest

from protocol.market import (
    MAX_AMOUNT,
    InvalidOrder,
    InvalidPayment,
    OrderItem,
    ProposalRecord,
    check_order_proposal,
    check_payment,
    money,
    money_text,
    transaction,
)


def item(price: Any, quantity: Any = 1, **extra: Any) -> dict[str, Any]:
    return {"id": "i1", "name": "pizza", "price": price, "quantity": quantity, **extra}


def test_totals_are_exact_decimals() -> None:
    order = check_order_proposal({"items": [item(0.1), item(0.2)], "total_price": 0.3})
    assert order.total_price == Decimal("0.3")
    order = check_order_proposal({"items": [item(19.99, 3)], "total_price": "59.97"})
    assert order.total_price == Decimal("59.97")


@pytest.mark.parametrize(
    ("payload", "rule"),
    [
        ({"items": [], "total_price": 0}, "empty_items"),
        ({"total_price": 1}, "empty_items"),
        ({"items": [item(2, 2)], "total_price": 5}, "total_mismatch"),
        ({"items": [item(0.1), item(0.2)], "total_price": 0.31}, "total_mismatch"),
        ({"items": [item(-1)], "total_price": -1}, "non_positive_price"),
        ({"items": [item(0)], "total_price": 0}, "non_positive_price"),
        ({"items": [item(1, 0)], "total_price": 0}, "non_positive_quantity"),
        ({"items": [item(1, 1.5)], "total_price": 1.5}, "bad_field"),
        ({"items": [item("abc")], "total_price": 1}, "bad_field"),
        ({"items": [item(1.0000001)], "total_price": 1.0000001}, "bad_field"),
        ({"items": [{"name": "x", "price": 1, "quantity": 1}], "total_price": 1}, "bad_field"),
        ({"items": [item(1)], "total_price": 1, "expires_at": "tomorrow"}, "bad_expiry"),
    ],
)
def test_each_order_rule(payload: dict[str, Any], rule: str) -> None:
    with pytest.raises(InvalidOrder) as refused:
        check_order_proposal(payload)
    assert refused.value.rule == rule


def test_expiry_is_iso_8601_and_naive_means_utc() -> None:
    order = check_order_proposal(
        {"items": [item(1)], "total_price": 1, "expires_at": "2026-01-01T00:00:00"}
    )
    zulu = check_order_proposal(
        {"items": [item(1)], "total_price": 1, "expires_at": "2026-01-01T00:00:00Z"}
    )
    assert order.expires_at == zulu.expires_at == 1767225600.0


PROPOSAL = ProposalRecord("p1", "shop", "alice", Decimal("0.3"), expires_at=1000.0)


def pay(
    amount: Any = 0.3,
    *,
    payer: str = "alice",
    payee: str = "shop",
    proposal: ProposalRecord | None = PROPOSAL,
    now: float = 500.0,
) -> Decimal:
    payload = {"amount": amount, "proposal_message_id": "p1"}
    return check_payment(payload, payer_id=payer, payee_id=payee, proposal=proposal, now=now)


def test_a_valid_payment_returns_its_amount() -> None:
    assert pay(0.30) == Decimal("0.3")
    assert pay("0.30") == Decimal("0.3")


@pytest.mark.parametrize(
    ("kwargs", "rule"),
    [
        ({"proposal": None}, "unknown_proposal"),
        ({"payee": "other_shop"}, "wrong_payee"),
        ({"payer": "mallory"}, "wrong_payer"),
        ({"now": 1001.0}, "expired"),
        ({"amount": 0.29}, "wrong_amount"),
        ({"amount": 0.31}, "wrong_amount"),
        ({"amount": 0.30000000000000004}, "bad_field"),
        ({"amount": True}, "bad_field"),
        (
            {"proposal": ProposalRecord("p1", "shop", "alice", Decimal("0.3"), None, "pay-1")},
            "already_paid",
        ),
    ],
)
def test_each_payment_rule(kwargs: dict[str, Any], rule: str) -> None:
    with pytest.raises(InvalidPayment) as refused:
        pay(**kwargs)
    assert refused.value.rule == rule


def test_money_text_keeps_exact_values() -> None:
    assert money_text(Decimal("15")) == "15.00"
    assert money_text(Decimal("0.3")) == "0.30"
    assert money_text(Decimal("0.125")) == "0.125"
    assert money(0.1) + money(0.2) == money("0.3")


def test_proposal_record_round_trip() -> None:
    record = ProposalRecord("p", "s", "c", Decimal("12.50"), 5.0, "pay", "tx")
    assert ProposalRecord.from_dict(record.to_dict()) == record


def order(*items: Any, total: Any = 2, **extra: Any) -> dict[str, Any]:
    return {"items": list(items), "total_price": total, **extra}


@pytest.mark.parametrize(
    ("payload", "reason", "rule"),
    [
        (order(), "an ORDER_PROPOSAL needs a non-empty list 'items'", "empty_items"),
        (order(item(1), "x"), "items[1] must be an object", "bad_field"),
        (
            order({"id": 1, "name": "n", "price": 1, "quantity": 1}),
            "items[0] needs string 'id' and 'name'",
            "bad_field",
        ),
        (
            order({"id": "i", "price": 1, "quantity": 1}),
            "items[0] needs string 'id' and 'name'",
            "bad_field",
        ),
        (order(item("abc")), "items[0].price must be a number", "bad_field"),
        (order(item(1, 1.5)), "items[0].quantity must be an integer", "bad_field"),
        (order(item(1, True)), "items[0].quantity must be an integer", "bad_field"),
        (order(item(0)), "items[0].price must be positive", "non_positive_price"),
        (order(item(1, -1)), "items[0].quantity must be positive", "non_positive_quantity"),
        (order(item(1, 2), total="x"), "total_price must be a number", "bad_field"),
        (
            order(item(1, 2), total=3),
            "total_price 3 is not the sum of price x quantity of the items (2)",
            "total_mismatch",
        ),
        (
            order(item(1, 2), expires_at=5),
            "expires_at must be an ISO-8601 date-time string",
            "bad_expiry",
        ),
        (order(item(1, 2), expires_at="soon"), "expires_at 'soon' is not ISO-8601", "bad_expiry"),
    ],
)
def test_each_order_refusal_says_what_is_wrong(
    payload: dict[str, Any], reason: str, rule: str
) -> None:
    with pytest.raises(InvalidOrder) as refused:
        check_order_proposal(payload)
    assert refused.value.reason == reason
    assert str(refused.value) == f"{reason} (rule: {rule})"


def test_an_order_keeps_each_item_as_sent() -> None:
    proposal = check_order_proposal(
        order(item("1.50", 2, id="a", name="tea"), item(3, 1, id="b", name="cake"), total="6")
    )
    assert proposal.items == (
        OrderItem("a", "tea", Decimal("1.50"), 2),
        OrderItem("b", "cake", Decimal("3"), 1),
    )
    assert proposal.expires_at is None


def test_an_expiry_with_an_offset_is_that_instant(monkeypatch: pytest.MonkeyPatch) -> None:
    """An offset is kept, and a date-time without one is UTC whatever the machine's zone."""
    monkeypatch.setenv("TZ", "America/New_York")
    time.tzset()
    try:
        with_offset = check_order_proposal(
            order(item(1, 2), expires_at="2026-01-01T02:00:00+02:00")
        )
        naive = check_order_proposal(order(item(1, 2), expires_at="2026-01-01T00:00:00"))
    finally:
        monkeypatch.undo()
        time.tzset()
    assert with_offset.expires_at == naive.expires_at == 1767225600.0


@pytest.mark.parametrize(
    ("raw", "problem"),
    [
        (True, "must be a number"),
        ([1], "must be a number"),
        ("abc", "must be a number"),
        ("NaN", "must be a finite number"),
        ("Infinity", "must be a finite number"),
        ("1.0000001", "has more than 6 decimal places"),
        (10**15, "is too large"),
        (-(10**15), "is too large"),
    ],
)
def test_money_names_what_is_wrong_with_an_amount(raw: Any, problem: str) -> None:
    with pytest.raises(ValueError, match=f"^price {problem}$"):
        money(raw, "price")
    with pytest.raises(ValueError, match=f"^amount {problem}$"):
        money(raw)


def test_money_takes_six_places_up_to_just_below_the_maximum() -> None:
    assert money("0.000001") == Decimal("0.000001")
    assert money("999999999999999.999999") == MAX_AMOUNT - Decimal("0.000001")
    assert money(-5) == Decimal(-5)


@pytest.mark.parametrize(
    ("kwargs", "reason", "rule"),
    [
        ({"proposal": None}, "no order proposal 'p1' is known", "unknown_proposal"),
        (
            {"payee": "other_shop"},
            "proposal 'p1' was made by 'shop', not 'other_shop'",
            "wrong_payee",
        ),
        ({"payer": "mallory"}, "proposal 'p1' was made to 'alice', not 'mallory'", "wrong_payer"),
        ({"now": 1000.5}, "proposal 'p1' has expired", "expired"),
        (
            {"amount": 0.31},
            "amount 0.31 does not equal the proposal's total_price 0.3",
            "wrong_amount",
        ),
        ({"amount": "x"}, "amount must be a number", "bad_field"),
        (
            {"proposal": ProposalRecord("p1", "shop", "alice", Decimal("0.3"), None, "pay-1")},
            "proposal 'p1' is already paid",
            "already_paid",
        ),
    ],
)
def test_each_payment_refusal_says_what_is_wrong(
    kwargs: dict[str, Any], reason: str, rule: str
) -> None:
    with pytest.raises(InvalidPayment) as refused:
        pay(**kwargs)
    assert refused.value.reason == reason
    assert str(refused.value) == f"{reason} (rule: {rule})"


def test_a_payment_names_its_proposal_by_id() -> None:
    payload = {"amount": 0.3}
    with pytest.raises(InvalidPayment) as refused:
        check_payment(payload, payer_id="alice", payee_id="shop", proposal=PROPOSAL, now=0.0)
    assert str(refused.value) == (
        "a PAYMENT needs a string 'proposal_message_id' (rule: bad_field)"
    )


def test_a_proposal_can_be_paid_up_to_its_expiry() -> None:
    assert pay(now=1000.0) == Decimal("0.3")


def test_a_transaction_is_json_safe_with_an_exact_amount_and_a_utc_time() -> None:
    tx = transaction(
        "tx-1",
        kind="payment",
        buyer="alice",
        seller="shop",
        amount=Decimal("4.5"),
        goods={"tea": 1},
        reference="p1",
        now=1_700_000_000.0,
    )
    assert tx == {
        "transaction_id": "tx-1",
        "kind": "payment",
        "buyer": "alice",
        "seller": "shop",
        "amount": "4.50",
        "goods": {"tea": 1},
        "reference": "p1",
        "created_at": "2023-11-14T22:13:20+00:00",
    }
