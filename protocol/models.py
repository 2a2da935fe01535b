"""Wire types of the Agent Lobby Protocol.

The envelope (`Message`) is a slots dataclass, not a `BaseModel`: it is built once per message on
the lobby's hot path, where a pydantic validation pass costs several microseconds. `codec.decode`
checks its fields by hand; pydantic still derives its JSON Schema (`schema.py`) and validates it
wherever speed does not matter. Payloads are pydantic models, validated where they are consumed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum
from typing import Annotated, Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field

from protocol.limits import MAX_AGENT_ID_LENGTH, MAX_ID_LENGTH, MAX_NAME_LENGTH

LOBBY_ID: Final = "global_lobby"
"""The lobby's own id: the `receiver_id` of every message addressed to the lobby."""

AGENT_ID_PATTERN: Final = rf"^[A-Za-z0-9._:@-]{{1,{MAX_AGENT_ID_LENGTH}}}$"
AGENT_ID_RE: Final = re.compile(AGENT_ID_PATTERN)

TRACEPARENT_PATTERN: Final = r"^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}(-.*)?$"
"""A W3C `traceparent` (version-traceid-parentid-flags); `codec.decode` checks the rest."""

AgentId = Annotated[str, Field(pattern=AGENT_ID_PATTERN)]
AgentIdRef = Annotated[str, Field(max_length=MAX_AGENT_ID_LENGTH)]
"""An agent id named in a payload: a longer one could never name an agent."""
Name = Annotated[str, Field(max_length=MAX_NAME_LENGTH)]
"""A keyword or an attribute key (a capability name is one too, of at least one character)."""


class MessageType(StrEnum):
    REGISTER = "REGISTER"
    REGISTER_ACK = "REGISTER_ACK"
    DISCOVER_SERVICES = "DISCOVER_SERVICES"
    SERVICES_AVAILABLE = "SERVICES_AVAILABLE"
    REQUEST = "REQUEST"
    RESPONSE = "RESPONSE"
    ERROR = "ERROR"
    UPDATE_CAPABILITIES = "UPDATE_CAPABILITIES"
    UNREGISTER = "UNREGISTER"
    ACK = "ACK"
    ACCEPTED = "ACCEPTED"
    CFP = "CFP"
    PROPOSE = "PROPOSE"
    ACCEPT = "ACCEPT"
    DECLINE = "DECLINE"
    MATCH_ACCEPT = "MATCH_ACCEPT"
    TRANSACTION_CONFIRMED = "TRANSACTION_CONFIRMED"
    DIALOGUE_EXPIRED = "DIALOGUE_EXPIRED"
    BIDS_REVEALED = "BIDS_REVEALED"
    LIST_TRANSACTIONS = "LIST_TRANSACTIONS"
    TRANSACTIONS = "TRANSACTIONS"
    TEXT = "TEXT"
    ORDER_PROPOSAL = "ORDER_PROPOSAL"
    PAYMENT = "PAYMENT"
    PAYMENT_CONFIRMED = "PAYMENT_CONFIRMED"
    FETCH_MESSAGES = "FETCH_MESSAGES"
    MESSAGES = "MESSAGES"


class ErrorCode(StrEnum):
    """The `code` of an ERROR payload (and of lobby-made error RESPONSEs).

    Codes are only ever added, never renamed: agents match on them.
    """

    MALFORMED = "malformed"
    NOT_REGISTERED = "not_registered"
    ALREADY_REGISTERED = "already_registered"
    AGENT_ID_TAKEN = "agent_id_taken"
    AUTH_FAILED = "auth_failed"
    UNKNOWN_RECEIVER = "unknown_receiver"
    CAPABILITY_NOT_FOUND = "capability_not_found"
    UNAUTHORIZED = "unauthorized"
    UNKNOWN_CONVERSATION = "unknown_conversation"
    INVALID_INPUT = "invalid_input"
    INVALID_DIALOGUE = "invalid_dialogue"
    INVALID_PAYMENT = "invalid_payment"
    MAILBOX_FULL = "mailbox_full"
    RATE_LIMITED = "rate_limited"
    INTERNAL = "internal"
    LIMIT_EXCEEDED = "limit_exceeded"


class CloseCode:
    """WebSocket close codes the lobby uses (PROTOCOL.md, "Close codes")."""

    NORMAL: Final = 1000
    GOING_AWAY: Final = 1001
    PROTOCOL_ERROR: Final = 1002
    """A frame that breaks RFC 6455 (a reserved bit set, say)."""
    POLICY_VIOLATION: Final = 1008
    """No REGISTER within the handshake timeout."""
    MESSAGE_TOO_BIG: Final = 1009
    TRY_AGAIN: Final = 1013
    """A cluster node cannot take the agent now (its home node is down, being failed over)."""
    REPLACED: Final = 4001
    TOO_SLOW: Final = 4002
    UNREGISTERED: Final = 4003


CLOSE_CODE_NAMES: Final[dict[int, str]] = {
    1000: "normal",
    1001: "going_away",
    1002: "protocol_error",
    1005: "no_status",
    1006: "abnormal",
    1007: "invalid_data",
    1008: "policy_violation",
    1009: "message_too_big",
    1011: "internal_error",
    4001: "replaced",
    4002: "too_slow",
    4003: "unregistered",
}
"""What a close code means, as log lines name it (`close_code=4003 close="unregistered"`)."""


def close_code_name(code: int | None) -> str:
    """The name of a WebSocket close code: those above, else "unknown" (or "none")."""
    if code is None:
        return "none"
    return CLOSE_CODE_NAMES.get(code, "unknown")


class RegisterStatus(StrEnum):
    REGISTERED = "success_registered_finalized"
    RESUMED = "success_resumed"


class ResponseStatus(StrEnum):
    """The usual RESPONSE statuses. Agents may use others; any status but
    `in_progress` ends the conversation."""

    SUCCESS = "success"
    ERROR = "error"
    IN_PROGRESS = "in_progress"


@dataclass(slots=True)
class Message:
    """The envelope every frame carries (seed 003 section 3, extended).

    `auth_token` is only ever set on messages an agent sends; the lobby strips it before
    forwarding. `seq` and `redelivered` are only set by the lobby, on delivery. The length
    limits (`protocol.limits`) are checked by `codec.decode`; here they only reach the schema.
    """

    sender_id: Annotated[
        str,
        Field(
            max_length=MAX_AGENT_ID_LENGTH,
            description="The sending agent's id, or 'global_lobby'.",
        ),
    ]
    receiver_id: Annotated[
        str,
        Field(
            max_length=MAX_AGENT_ID_LENGTH,
            description="The receiving agent's id, or 'global_lobby' for the lobby.",
        ),
    ]
    message_type: MessageType
    payload: Annotated[dict[str, Any], Field(description="Varies by message_type; may be {}.")]
    conversation_id: Annotated[
        str | None,
        Field(max_length=MAX_ID_LENGTH, description="Correlates the messages of one exchange."),
    ] = None
    auth_token: Annotated[
        str | None,
        Field(
            max_length=MAX_ID_LENGTH,
            description="The token from REGISTER_ACK; required on every message but REGISTER.",
        ),
    ] = None
    message_id: Annotated[
        str | None,
        Field(
            max_length=MAX_ID_LENGTH,
            description="Set by the sender or, when absent, by the lobby.",
        ),
    ] = None
    in_reply_to: Annotated[
        str | None,
        Field(
            max_length=MAX_ID_LENGTH,
            description="The message_id this message answers (FIPA target).",
        ),
    ] = None
    seq: Annotated[
        int | None, Field(description="Per-receiver delivery number, set by the lobby.")
    ] = None
    redelivered: Annotated[
        bool | None, Field(description="Set by the lobby on a message delivered again.")
    ] = None
    traceparent: Annotated[
        str | None,
        Field(
            pattern=TRACEPARENT_PATTERN,
            description="W3C Trace Context: the trace this message belongs to. Kept on "
            "everything the lobby forwards, with a new parent-id per hop.",
        ),
    ] = None


class _Payload(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


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
    attributes: dict[Name, str | int | float | bool | list[str]] | None = Field(
        default=None,
        description="Structured metadata that DISCOVER_SERVICES `filters` match on "
        "(e.g. price, city, cuisine).",
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


DISCOVER_LIMIT: Final = 100
"""Capabilities in one DISCOVER_SERVICES answer when `limit` is not given (a lookup)."""
SEARCH_LIMIT: Final = 50
"""The same for a ranked search."""
MAX_DISCOVER_LIMIT: Final = 200
"""The largest `limit`: one answer is one turn of the lobby's event loop, kept short."""
MAX_RANK: Final = 500
"""A ranked search serves its results up to this rank (`offset` + `limit`, or by `cursor`)."""


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
    filters: list[dict[str, Any]] | None = Field(
        default=None,
        max_length=8,
        description="Constraints on capability `attributes`: "
        '{"attribute": str, "op": "eq"|"ne"|"lt"|"le"|"gt"|"ge"|"in"|"contains", "value": ...}.',
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


class ServiceRecord(_Payload):
    agent_id: str
    relevant_capabilities: list[Capability]
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
    """REQUEST: the capability to call plus its input, as fields beside `capability_name`."""

    model_config = ConfigDict(extra="allow", frozen=True)

    capability_name: str


class ResponsePayload(BaseModel):
    """RESPONSE: a status plus the capability's output (or `code` and `error` on failure)."""

    model_config = ConfigDict(extra="allow", frozen=True)

    status: str
    code: str | None = None
    error: str | None = None


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


Number = int | float | str
"""Money and prices: a JSON number (or a numeric string), read as an exact decimal."""


class SealedTerms(_Payload):
    reply_by: float = Field(gt=0, description="Seconds the round stays open.")
    round_id: str | None = Field(
        default=None, description="Set by the lobby on the CFP each receiver gets."
    )


class CfpPayload(_Payload):
    query: dict[str, Any] = Field(
        description="What is wanted: free-form (goods, quantities, an RFP...). "
        "`role`: 'buyer' (default) or 'seller' says which side the CFP's sender is on."
    )
    reply_by: float | None = Field(default=None, description="Seconds to the first reply.")
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
    kind: str = Field(description="'negotiation' (a matched dialogue) or 'payment'.")
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
    price: Number
    quantity: int


class OrderProposalPayload(_Payload):
    items: list[OrderItemModel]
    total_price: Number
    expires_at: str | None = Field(default=None, description="ISO-8601 date-time.")


class PaymentPayload(_Payload):
    amount: Number
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
}
"""The payload model of each message type; `schema.py` and the tests walk this table."""
