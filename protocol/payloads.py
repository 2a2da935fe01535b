"""Payload models of the Agent Lobby Protocol: one per message type that has a payload.

Pydantic models, validated where they are consumed (never on the lobby's routing hot path);
`PAYLOAD_MODELS` maps each message type to its model, and `schema.py` and `asyncapi.py` walk it.
"""

from __future__ import annotations

from typing import Annotated, Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, WithJsonSchema

from protocol.cancel import CancelPayload
from protocol.filters import FILTER_SCHEMA
from protocol.fipa import MAX_ROUND_REPLY_BY
from protocol.limits import MAX_NAME_LENGTH
from protocol.models import LOBBY_ID, AgentIdRef, ErrorCode, MessageType, Name, RegisterStatus
from protocol.multiturn import InputPayload
from protocol.presence import PresencePayload, UnwatchPayload, WatchPayload


class _Payload(BaseModel):
    # Strict: JSON types as the schemas state them (`"3"` is not an integer, `"yes"` not a
    # boolean), so what the schema refuses the lobby refuses too.
    model_config = ConfigDict(extra="ignore", frozen=True, strict=True)


# An attribute's or a filter's value as a schema without a type: its rules sit in `not`, which
# generators leave alone, so a Go model holds any value (Modelina's Go unions drop theirs).
ATTRIBUTE_VALUE: Final[dict[str, Any]] = {
    "title": "AttributeValue",
    "description": "A string, a number, a boolean or a list of strings.",
    "not": {
        "anyOf": [
            {"type": ["object", "null"]},
            {"type": "array", "contains": {"not": {"type": "string"}}},
        ]
    },
}
AttributeValue = Annotated[str | int | float | bool | list[str], WithJsonSchema(ATTRIBUTE_VALUE)]


class Capability(BaseModel):
    """A service an agent offers (seed 003 section 7)."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    name: Annotated[str, Field(min_length=1, max_length=MAX_NAME_LENGTH)]
    description: str = ""
    input_schema: dict[str, Any] = Field(
        default_factory=dict,
        description="JSON Schema of a REQUEST's arguments (its payload without "
        "`capability_name`), checked by the lobby; `{}` accepts any arguments.",
    )
    output_schema: dict[str, Any] = Field(default_factory=dict)
    keywords: list[Name] = Field(default_factory=list)
    authorized_requester_ids: list[AgentIdRef] | None = None
    """Agents allowed to call this capability; `null` or `[]` means public."""
    attributes: dict[Name, AttributeValue] | None = Field(
        default=None,
        description="Structured metadata that DISCOVER_SERVICES `filters` match on "
        "(e.g. price, city, cuisine).",
    )
    arguments_form: Literal["flat", "object"] | None = Field(
        default=None,
        description="How this capability's REQUESTs are delivered: 'flat' (the default) with "
        "the arguments beside `capability_name`, or 'object' with them in `arguments`, for a "
        "receiver whose generated models keep only declared fields.",
    )


class RegisterPayload(_Payload):
    """REGISTER. Absent `capabilities` on a resume keeps the agent's current ones."""

    capabilities: list[Capability] | None = None
    registration_key: str | None = Field(
        default=None, description="Required when the lobby runs with --registration-key."
    )
    acks: bool = Field(
        default=False,
        description="This agent acknowledges what it receives with ACK and wants ACCEPTED "
        "confirmations of what it sends (see PROTOCOL.md, Delivery).",
    )


class RegisterAckPayload(_Payload):
    status: RegisterStatus
    lobby_id: str = LOBBY_ID
    auth_token: str
    lobby_identity: str | None = Field(
        default=None,
        description="This lobby's own identity, kept with its state (the same on every node "
        "of a cluster): a client keeps the auth_token under it, and offers it to no other "
        "lobby. The handshake response's Agent-Lobby-Id header carries it too.",
    )


DISCOVER_LIMIT: Final = 100
"""Capabilities in one DISCOVER_SERVICES answer when `limit` is not given (a lookup)."""
SEARCH_LIMIT: Final = 50
"""The same for a ranked search."""
MAX_DISCOVER_LIMIT: Final = 200
"""The largest `limit`: one answer is one turn of the lobby's event loop, kept short."""
MAX_RANK: Final = 500
"""A ranked search serves its results up to this rank (`offset` + `limit`, or by `cursor`)."""


MAX_FILTERS: Final = 8
"""Filters one DISCOVER_SERVICES, or one REQUEST to the lobby, may carry."""


class DiscoverServicesPayload(_Payload):
    """DISCOVER_SERVICES: by exact capability name, by keywords (any match), or both (all must
    match). With neither, every capability of every other agent is listed. Answers are pages:
    pass an answer's `next` back as `cursor` for the following one."""

    capability_name: str | None = None
    keywords: list[str] | None = Field(
        default=None,
        max_length=32,
        description="Capabilities sharing at least one keyword (case-insensitive).",
    )
    query_keywords: list[str] | None = Field(
        default=None, max_length=32, description="Seed 003 spelling of `keywords`; both work."
    )
    query: str | None = Field(
        default=None, max_length=1000, description="Free text, for ranked search."
    )
    algorithm: Literal["simple", "filtered", "lexical"] | None = Field(
        default=None, description="Ranked search; default lexical with a query, else filtered."
    )
    filters: list[Annotated[dict[str, Any], WithJsonSchema(FILTER_SCHEMA)]] | None = Field(
        default=None,
        max_length=MAX_FILTERS,
        description="Constraints on capability `attributes`, all of which must hold.",
    )
    limit: int | None = Field(
        default=None,
        ge=1,
        le=MAX_DISCOVER_LIMIT,
        description=f"Capabilities per answer: default {DISCOVER_LIMIT} "
        f"({SEARCH_LIMIT} for a ranked search); fewer when the answer would pass the lobby's "
        "byte bound.",
    )
    offset: int = Field(
        default=0,
        ge=0,
        lt=MAX_RANK,
        description=f"Ranked search: results to skip; offset + limit at most {MAX_RANK}. "
        "Prefer `cursor`.",
    )
    cursor: str | None = Field(
        default=None,
        max_length=4096,
        description="The `next` of the previous answer to the same query: where this page starts.",
    )

    @property
    def ranked(self) -> bool:
        return any(v is not None for v in (self.query, self.algorithm, self.filters))


class FoundCapability(Capability):
    """A capability in a SERVICES_AVAILABLE answer."""

    score: float | None = Field(default=None, description="Its score, in a ranked search.")


class ServiceRecord(_Payload):
    agent_id: str
    relevant_capabilities: list[FoundCapability]
    online: bool
    score: float | None = Field(default=None, description="Best score, in a ranked search.")


class ServicesAvailablePayload(_Payload):
    services_found: list[ServiceRecord]
    """In answer order; an agent whose capabilities span two pages is listed in both."""
    discovered_for_capability: str | None = None
    total: int | None = Field(
        default=None,
        description="Matching capabilities before paging, in a ranked search "
        "(null when not counted: a `simple` search over more than one window).",
    )
    next: str | None = Field(
        default=None,
        description="Send it back as `cursor` (same query) for the next page; null: no more.",
    )
    approximate: bool | None = Field(
        default=None,
        description="True when a lexical ranking was cut short to bound its cost: the page "
        "holds high-scoring capabilities, not necessarily the best.",
    )


class RequestPayload(BaseModel):
    """REQUEST: the capability to call plus its input, as fields beside `capability_name`, or
    as one `arguments` object (then the payload's only other field). The lobby delivers them in
    the form the capability's `arguments_form` asks for. A REQUEST to `global_lobby` names a
    capability, not an agent: the lobby chooses the provider; its payload is the object form
    only, with optional `filters`."""

    model_config = ConfigDict(extra="allow", frozen=True)

    capability_name: str
    arguments: dict[str, Any] | None = Field(
        default=None,
        description="The capability's input as one object, instead of fields beside "
        "`capability_name`: the form a generated model keeps whole.",
    )
    filters: list[Annotated[dict[str, Any], WithJsonSchema(FILTER_SCHEMA)]] | None = Field(
        default=None,
        max_length=MAX_FILTERS,
        description="Only in a REQUEST to `global_lobby`: constraints on capability "
        "`attributes` (as DISCOVER_SERVICES takes them) the chosen provider's must meet.",
    )


class ResponsePayload(BaseModel):
    """RESPONSE: a status plus the capability's output (or `code` and `error` on failure)."""

    model_config = ConfigDict(extra="allow", frozen=True)

    status: str
    code: str | None = None
    error: str | None = None
    path: str | None = Field(
        default=None,
        description="On the lobby's `invalid_input` RESPONSE: the JSON Pointer of the failing "
        "argument.",
    )
    input_required: dict[str, Any] | None = Field(
        default=None, description="With status `in_progress` only: what the provider asks (§5.3)."
    )


class ErrorPayload(_Payload):
    error: str
    code: ErrorCode
    original_message_type: str | None = None
    original_conversation_id: str | None = None


class UpdateCapabilitiesPayload(_Payload):
    capabilities: list[Capability]


class UnregisterPayload(_Payload):
    pass


class AckPayload(_Payload):
    """ACK (agent to lobby): every message delivered to me with `seq <= up_to` is processed."""

    up_to: Annotated[int, Field(ge=0)]


class AcceptedPayload(_Payload):
    """ACCEPTED (lobby to agent): the lobby has durably accepted the message with this
    `message_id` and every message the agent sent before it on this connection."""

    message_id: str


MONEY_PATTERN: Final = r"^(?=[0-9.]*[1-9])[0-9]{1,15}(\.[0-9]{1,6})?$"
"""A positive amount as a decimal string: below 10^15, at most six decimal places
(`protocol.market`)."""
Money = Annotated[
    int | float | str,
    WithJsonSchema(
        {
            "type": "string",
            "pattern": MONEY_PATTERN,
            "description": 'A positive decimal amount, as a string ("12.50"); the lobby also '
            "takes a JSON number from older senders.",
        }
    ),
]
"""Money and prices: written as a decimal string, read as an exact decimal (a JSON number
is still taken)."""


class SealedTerms(_Payload):
    reply_by: float = Field(
        gt=0, le=MAX_ROUND_REPLY_BY, description="Seconds the round stays open (at most 24 h)."
    )
    round_id: str | None = Field(
        default=None, description="Set by the lobby on the CFP each receiver gets."
    )


class CfpPayload(_Payload):
    query: dict[str, Any] = Field(
        description="What is wanted: free-form (goods, quantities, an RFP...). "
        "`role`: 'buyer' (default) or 'seller' says which side the CFP's sender is on."
    )
    reply_by: float | None = Field(default=None, gt=0, description="Seconds to the first reply.")
    sealed: SealedTerms | None = Field(
        default=None,
        description="A sealed round (CFP addressed to 'global_lobby'): the lobby holds every "
        "PROPOSE until `reply_by` or until every receiver answered, then reveals them together "
        "in BIDS_REVEALED. On the CFP each receiver gets, it also carries `round_id`.",
    )
    receivers: list[AgentIdRef] | None = Field(
        default=None, description="A sealed round's receivers (or give `capability_name`)."
    )
    capability_name: Name | None = Field(
        default=None,
        description="A sealed round asks every agent offering a capability of this name.",
    )


class Bid(_Payload):
    dialogue_id: str = Field(description="The bidder's dialogue: answer it with ACCEPT/DECLINE.")
    sender_id: str
    message_id: str = Field(description="The PROPOSE's id: the ACCEPT's `in_reply_to`.")
    proposal: dict[str, Any]


class DeclinedBid(_Payload):
    dialogue_id: str
    sender_id: str
    reason: str | None = None


class BidsRevealedPayload(_Payload):
    """BIDS_REVEALED (lobby to the round's buyer): every held PROPOSE of a sealed round, at
    once, in `reveal_order` of `seed`."""

    round_id: str
    seed: str = Field(
        description="Bids are ordered by the SHA-256 hex of '<seed>:<sender_id>', ascending."
    )
    reply_by: float = Field(description="The round's deadline (Unix time).")
    bids: list[Bid]
    declined: list[DeclinedBid]
    unanswered: list[str] = Field(description="Receivers that neither proposed nor declined.")


class ProposePayload(_Payload):
    proposal: dict[str, Any] = Field(
        description="Free-form offer; `price` (a number) and `goods` are what a transaction "
        "records."
    )


class AcceptPayload(_Payload):
    pass


class DeclinePayload(_Payload):
    reason: str | None = None


class MatchAcceptPayload(_Payload):
    pass


class Transaction(_Payload):
    transaction_id: str
    kind: Literal["negotiation", "payment"] = Field(
        description="'negotiation' (a matched dialogue) or 'payment'."
    )
    buyer: str
    seller: str
    amount: str = Field(description="Exact decimal, as a string.")
    goods: Any = None
    reference: str = Field(description="The dialogue id, or the paid proposal's message_id.")
    created_at: str


class TransactionConfirmedPayload(_Payload):
    transaction: Transaction


class DialogueExpiredPayload(_Payload):
    dialogue_id: str
    reason: str


class ListTransactionsPayload(_Payload):
    pass


class TransactionsPayload(_Payload):
    transactions: list[Transaction]


class TextPayload(_Payload):
    content: str


class OrderItemModel(_Payload):
    id: str
    name: str
    price: Money
    quantity: int = Field(ge=1)


class OrderProposalPayload(_Payload):
    items: list[OrderItemModel] = Field(min_length=1)
    total_price: Money
    expires_at: str | None = Field(default=None, description="ISO-8601 date-time.")


class PaymentPayload(_Payload):
    amount: Money
    proposal_message_id: str


class PaymentConfirmedPayload(_Payload):
    transaction: Transaction


class FetchMessagesPayload(_Payload):
    since: int | None = Field(
        default=None,
        description="The cursor of the last MESSAGES: everything up to it is acknowledged.",
    )
    limit: int = Field(default=100, ge=1, le=1000)


class MessagesPayload(_Payload):
    messages: list[dict[str, Any]]
    cursor: int


PAYLOAD_MODELS: Final[dict[MessageType, type[BaseModel]]] = {
    MessageType.REGISTER: RegisterPayload,
    MessageType.REGISTER_ACK: RegisterAckPayload,
    MessageType.DISCOVER_SERVICES: DiscoverServicesPayload,
    MessageType.SERVICES_AVAILABLE: ServicesAvailablePayload,
    MessageType.REQUEST: RequestPayload,
    MessageType.RESPONSE: ResponsePayload,
    MessageType.ERROR: ErrorPayload,
    MessageType.UPDATE_CAPABILITIES: UpdateCapabilitiesPayload,
    MessageType.UNREGISTER: UnregisterPayload,
    MessageType.ACK: AckPayload,
    MessageType.ACCEPTED: AcceptedPayload,
    MessageType.CFP: CfpPayload,
    MessageType.PROPOSE: ProposePayload,
    MessageType.ACCEPT: AcceptPayload,
    MessageType.DECLINE: DeclinePayload,
    MessageType.MATCH_ACCEPT: MatchAcceptPayload,
    MessageType.TRANSACTION_CONFIRMED: TransactionConfirmedPayload,
    MessageType.DIALOGUE_EXPIRED: DialogueExpiredPayload,
    MessageType.BIDS_REVEALED: BidsRevealedPayload,
    MessageType.LIST_TRANSACTIONS: ListTransactionsPayload,
    MessageType.TRANSACTIONS: TransactionsPayload,
    MessageType.TEXT: TextPayload,
    MessageType.ORDER_PROPOSAL: OrderProposalPayload,
    MessageType.PAYMENT: PaymentPayload,
    MessageType.PAYMENT_CONFIRMED: PaymentConfirmedPayload,
    MessageType.FETCH_MESSAGES: FetchMessagesPayload,
    MessageType.MESSAGES: MessagesPayload,
    MessageType.WATCH: WatchPayload,
    MessageType.UNWATCH: UnwatchPayload,
    MessageType.PRESENCE: PresencePayload,
    MessageType.CANCEL: CancelPayload,
    MessageType.INPUT: InputPayload,
}
"""The payload model of each message type; `schema.py` and the tests walk this table."""
