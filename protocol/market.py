"""Marketplace rules: order proposals and payments, checked with decimals.

Money is `decimal.Decimal`, parsed from the JSON text of a number (`str()` of what the decoder
gave), so `0.1 + 0.2` pays a `0.30` proposal exactly. Amounts have at most `MONEY_PLACES`
fractional digits and are below `MAX_AMOUNT`; more is refused rather than rounded. On the wire
the lobby writes amounts it computed as strings (`"0.30"` stays exact in every language).

A payment is valid only if its proposal exists, was sent BY the payment's receiver TO the
payment's sender, has not expired, is not paid yet, and the amount equals its total.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from decimal import Decimal, InvalidOperation
from typing import Any, Final

from protocol.errors import ProtocolError
from protocol.limits import clip

MONEY_PLACES: Final = 6
MAX_AMOUNT: Final = Decimal(10) ** 15


class InvalidOrder(ProtocolError):
    """An ORDER_PROPOSAL that breaks a rule; `rule` names it."""

    def __init__(self, rule: str, reason: str) -> None:
        super().__init__(f"{reason} (rule: {rule})")
        self.rule = rule
        self.reason = reason


class InvalidPayment(ProtocolError):
    """A PAYMENT that breaks a rule; `rule` names it."""

    def __init__(self, rule: str, reason: str) -> None:
        super().__init__(f"{reason} (rule: {rule})")
        self.rule = rule
        self.reason = reason


def money(raw: object, what: str = "amount") -> Decimal:
    """`raw` (a JSON number or numeric string) as an exact amount; ValueError names `what`."""
    if isinstance(raw, bool) or not isinstance(raw, int | float | str):
        raise ValueError(f"{what} must be a number")
    try:
        value = Decimal(str(raw))
    except InvalidOperation:
        raise ValueError(f"{what} must be a number") from None
    if not value.is_finite():
        raise ValueError(f"{what} must be a finite number")
    exponent = value.as_tuple().exponent
    if isinstance(exponent, int) and exponent < -MONEY_PLACES:
        raise ValueError(f"{what} has more than {MONEY_PLACES} decimal places")
    if abs(value) >= MAX_AMOUNT:
        raise ValueError(f"{what} is too large")
    return value


def money_text(value: Decimal) -> str:
    """An amount for the wire: plain notation, at least two decimal places."""
    exponent = value.as_tuple().exponent
    if isinstance(exponent, int) and exponent > -2:
        value = value.quantize(Decimal("0.01"))
    return f"{value:f}"


@dataclass(frozen=True, slots=True)
class OrderItem:
    id: str
    name: str
    price: Decimal
    quantity: int


@dataclass(frozen=True, slots=True)
class OrderProposal:
    items: tuple[OrderItem, ...]
    total_price: Decimal
    expires_at: float | None


def check_order_proposal(payload: dict[str, Any]) -> OrderProposal:
    """The proposal in an ORDER_PROPOSAL payload, or `InvalidOrder` naming the broken rule."""
    raw_items = payload.get("items")
    if not isinstance(raw_items, list) or not raw_items:
        raise InvalidOrder("empty_items", "an ORDER_PROPOSAL needs a non-empty list 'items'")
    items = []
    for index, raw in enumerate(raw_items):
        where = f"items[{index}]"
        if not isinstance(raw, dict):
            raise InvalidOrder("bad_field", f"{where} must be an object")
        item_id, name, quantity = raw.get("id"), raw.get("name"), raw.get("quantity")
        if not isinstance(item_id, str) or not isinstance(name, str):
            raise InvalidOrder("bad_field", f"{where} needs string 'id' and 'name'")
        try:
            price = money(raw.get("price"), f"{where}.price")
        except ValueError as exc:
            raise InvalidOrder("bad_field", str(exc)) from None
        if isinstance(quantity, bool) or not isinstance(quantity, int):
            raise InvalidOrder("bad_field", f"{where}.quantity must be an integer")
        if price <= 0:
            raise InvalidOrder("non_positive_price", f"{where}.price must be positive")
        if quantity <= 0:
            raise InvalidOrder("non_positive_quantity", f"{where}.quantity must be positive")
        items.append(OrderItem(item_id, name, price, quantity))
    try:
        total = money(payload.get("total_price"), "total_price")
    except ValueError as exc:
        raise InvalidOrder("bad_field", str(exc)) from None
    expected = sum((item.price * item.quantity for item in items), Decimal(0))
    if total != expected:
        raise InvalidOrder(
            "total_mismatch",
            f"total_price {total} is not the sum of price x quantity of the items ({expected})",
        )
    return OrderProposal(tuple(items), total, _expiry(payload.get("expires_at")))


def decimal_text(value: Decimal) -> str:
    """An amount as the lobby forwards it: the sender's digits in plain notation (`2.5` stays
    "2.5", `"2.50"` stays "2.50", `1e3` becomes "1000")."""
    return f"{value:f}"


def with_text_money(payload: dict[str, Any], order: OrderProposal) -> dict[str, Any]:
    """An ORDER_PROPOSAL payload checked into `order`, its money as decimal strings: what the
    receiver gets, so a typed client reads one type (the schema's) whatever the sender wrote."""
    items = [
        {**raw, "price": decimal_text(item.price)}
        for raw, item in zip(payload["items"], order.items, strict=True)
    ]
    return {**payload, "items": items, "total_price": decimal_text(order.total_price)}


def _expiry(raw: object) -> float | None:
    if raw is None:
        return None
    if not isinstance(raw, str):
        raise InvalidOrder("bad_expiry", "expires_at must be an ISO-8601 date-time string")
    try:
        when = datetime.fromisoformat(raw.replace("Z", "+00:00"))
    except ValueError:
        raise InvalidOrder("bad_expiry", f"expires_at {clip(raw)!r} is not ISO-8601") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)  # a date-time without offset is taken as UTC
    return when.timestamp()


@dataclass(slots=True)
class ProposalRecord:
    """An ORDER_PROPOSAL the lobby forwarded, kept to check payments against it."""

    message_id: str
    sender_id: str
    """The business that proposed (the payee)."""
    receiver_id: str
    """The customer it was proposed to (the payer)."""
    total_price: Decimal
    expires_at: float | None
    paid_by: str | None = None
    """The message_id of the PAYMENT that paid it."""
    transaction_id: str | None = None

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["total_price"] = str(self.total_price)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ProposalRecord:
        values = dict(data)
        values["total_price"] = Decimal(values["total_price"])
        return cls(**values)


def check_payment(
    payload: dict[str, Any],
    *,
    payer_id: str,
    payee_id: str,
    proposal: ProposalRecord | None,
    now: float,
) -> Decimal:
    """The amount of a valid PAYMENT, or `InvalidPayment` naming the first broken rule."""
    proposal_id = payload.get("proposal_message_id")
    if not isinstance(proposal_id, str):
        raise InvalidPayment("bad_field", "a PAYMENT needs a string 'proposal_message_id'")
    try:
        amount = money(payload.get("amount"), "amount")
    except ValueError as exc:
        raise InvalidPayment("bad_field", str(exc)) from None
    named = f"proposal {clip(proposal_id)!r}"
    if proposal is None:
        raise InvalidPayment("unknown_proposal", f"no order {named} is known")
    if proposal.sender_id != payee_id:
        raise InvalidPayment(
            "wrong_payee", f"{named} was made by {proposal.sender_id!r}, not {payee_id!r}"
        )
    if proposal.receiver_id != payer_id:
        raise InvalidPayment(
            "wrong_payer", f"{named} was made to {proposal.receiver_id!r}, not {payer_id!r}"
        )
    if proposal.expires_at is not None and now > proposal.expires_at:
        raise InvalidPayment("expired", f"{named} has expired")
    if proposal.paid_by is not None:
        raise InvalidPayment("already_paid", f"{named} is already paid")
    if amount != proposal.total_price:
        raise InvalidPayment(
            "wrong_amount",
            f"amount {amount} does not equal the proposal's total_price {proposal.total_price}",
        )
    return amount


def transaction(
    transaction_id: str,
    *,
    kind: str,
    buyer: str,
    seller: str,
    amount: Decimal,
    goods: Any,
    reference: str,
    now: float,
) -> dict[str, Any]:
    """A ledger entry as JSON-safe values (the amount as an exact string)."""
    return {
        "transaction_id": transaction_id,
        "kind": kind,
        "buyer": buyer,
        "seller": seller,
        "amount": money_text(amount),
        "goods": goods,
        "reference": reference,
        "created_at": datetime.fromtimestamp(now, UTC).isoformat(),
    }
