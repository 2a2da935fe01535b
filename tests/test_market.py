"""Order proposal and payment rules (protocol.market), pure and synchronous."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest

from protocol.market import (
    InvalidOrder,
    InvalidPayment,
    ProposalRecord,
    check_order_proposal,
    check_payment,
    money,
    money_text,
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
