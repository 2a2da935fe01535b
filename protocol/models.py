"""Wire types of the Agent Lobby Protocol.

The envelope (`Message`) is a slots dataclass, not a `BaseModel`: it is built once per message on
the lobby's hot path, where a pydantic validation pass costs several microseconds. `codec.decode`
checks its fields by hand; pydantic still derives its JSON Schema (`schema.py`) and validates it
wherever speed does not matter. Payloads are pydantic models (`payloads.py`), validated where
they are consumed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum
from typing import Annotated, Any, Final

from pydantic import Field

from protocol.limits import MAX_AGENT_ID_LENGTH, MAX_ID_LENGTH, MAX_NAME_LENGTH, MAX_TIMEOUT_MS

LOBBY_ID: Final = "global_lobby"
"""The lobby's own id: the `receiver_id` of every message addressed to the lobby."""

AGENT_ID_PATTERN: Final = rf"^[A-Za-z0-9._:@-]{{1,{MAX_AGENT_ID_LENGTH}}}$"
AGENT_ID_RE: Final = re.compile(AGENT_ID_PATTERN)

_TRACE_IDS: Final = r"(?!0{32})[0-9a-f]{32}-(?!0{16})[0-9a-f]{16}-[0-9a-f]{2}"
TRACEPARENT_PATTERN: Final = (
    rf"^(?:00-{_TRACE_IDS}|(?!00|ff)[0-9a-f]{{2}}-{_TRACE_IDS}(?:-[^ \t\n\r\f\v]*)?)$"
)
"""A W3C `traceparent` (version-traceid-parentid-flags) as `tracecontext.problem` holds it:
not version ff, version 00 exactly 55 characters, no all-zero trace-id or parent-id."""

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
    WATCH = "WATCH"
    UNWATCH = "UNWATCH"
    PRESENCE = "PRESENCE"
    CANCEL = "CANCEL"
    INPUT = "INPUT"


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
    NODE_UNAVAILABLE = "node_unavailable"
    NO_PROVIDER = "no_provider"
    TIMEOUT = "timeout"
    CANCELLED = "cancelled"


class CloseCode:
    """WebSocket close codes the lobby uses (PROTOCOL.md, "Close codes")."""

    NORMAL: Final = 1000
    GOING_AWAY: Final = 1001
    PROTOCOL_ERROR: Final = 1002
    """A frame that breaks RFC 6455 (a reserved bit set, say)."""
    INVALID_DATA: Final = 1007
    """A text message that is not UTF-8 (RFC 6455 8.1)."""
    POLICY_VIOLATION: Final = 1008
    """No REGISTER within the handshake timeout."""
    MESSAGE_TOO_BIG: Final = 1009
    SERVICE_RESTART: Final = 1012
    """A cluster node steps down (it was fenced) and rejoins: resume on another node."""
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
    1012: "service_restart",
    1013: "try_again_later",
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
            # Look-ahead, which pydantic's regex engine lacks: in the schema only.
            json_schema_extra={"pattern": TRACEPARENT_PATTERN},
            description="W3C Trace Context: the trace this message belongs to. Kept on "
            "everything the lobby forwards, with a new parent-id per hop.",
        ),
    ] = None
    timeout_ms: Annotated[
        int | None,
        Field(
            ge=1,
            le=MAX_TIMEOUT_MS,
            description="REQUEST only: how long the requester waits for the final RESPONSE, "
            "counted from when the lobby accepts it. Not forwarded: the receiver gets `deadline`.",
        ),
    ] = None
    deadline: Annotated[
        int | None,
        Field(
            description="Set by the lobby only, on a REQUEST sent with `timeout_ms`: when the "
            "requester stops waiting (Unix time in milliseconds, the lobby's clock).",
        ),
    ] = None
