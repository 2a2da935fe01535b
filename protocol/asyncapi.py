"""The whole protocol as one AsyncAPI 3.0 document, generated from the models (`lobby asyncapi`).

Described from the lobby's side, as AsyncAPI describes an application: one channel, the WebSocket
endpoint `/`, carries every message type; the lobby *receives* what agents send (one operation per
type, with a `reply` where the lobby answers directly) and *sends* what agents receive (its own
notices plus what it forwards from agent to agent). Each message is the envelope (`Message`) with
`message_type` fixed and `payload` the type's payload model; every schema lives once in
`components/schemas`. The committed copy, `protocol/asyncapi.json`, is kept equal to this by a
test and checked by the official AsyncAPI parser.
"""

from __future__ import annotations

from typing import Any, Final

from pydantic import TypeAdapter
from pydantic.json_schema import JsonSchemaMode

from protocol.models import LOBBY_ID, Message, MessageType
from protocol.payloads import PAYLOAD_MODELS

ASYNCAPI_VERSION: Final = "3.0.0"
PROTOCOL_VERSION: Final = "0.2.0"
CHANNEL: Final = "lobby"
_SCHEMAS: Final = "#/components/schemas/"

T = MessageType

TO_LOBBY: Final = (
    T.REGISTER,
    T.DISCOVER_SERVICES,
    T.UPDATE_CAPABILITIES,
    T.UNREGISTER,
    T.ACK,
    T.FETCH_MESSAGES,
    T.LIST_TRANSACTIONS,
)
"""Messages an agent addresses to the lobby (`receiver_id: "global_lobby"`)."""

FROM_LOBBY: Final = (
    T.REGISTER_ACK,
    T.SERVICES_AVAILABLE,
    T.ERROR,
    T.ACCEPTED,
    T.TRANSACTION_CONFIRMED,
    T.DIALOGUE_EXPIRED,
    T.BIDS_REVEALED,
    T.TRANSACTIONS,
    T.PAYMENT_CONFIRMED,
    T.MESSAGES,
)
"""Messages only the lobby sends; an agent that sends one gets ERROR `malformed`."""

BETWEEN_AGENTS: Final = (
    T.REQUEST,
    T.RESPONSE,
    T.CFP,
    T.PROPOSE,
    T.ACCEPT,
    T.DECLINE,
    T.MATCH_ACCEPT,
    T.TEXT,
    T.ORDER_PROPOSAL,
    T.PAYMENT,
)
"""Messages from one agent to another: checked by the lobby, then forwarded (or held)."""

REPLIES: Final[dict[MessageType, tuple[MessageType, ...]]] = {
    T.REGISTER: (T.REGISTER_ACK, T.ERROR),
    T.DISCOVER_SERVICES: (T.SERVICES_AVAILABLE, T.ERROR),
    T.FETCH_MESSAGES: (T.MESSAGES, T.ERROR),
    T.LIST_TRANSACTIONS: (T.TRANSACTIONS, T.ERROR),
    T.REQUEST: (T.RESPONSE, T.ERROR),
}
"""What answers a message sent to the lobby; any other is answered only by an ERROR if refused
(an agent-to-agent move is answered by the other agent, not the lobby)."""

_DIRECTION: Final = {
    **dict.fromkeys(TO_LOBBY, "Agent to lobby."),
    **dict.fromkeys(FROM_LOBBY, "Lobby to agent."),
    **dict.fromkeys(
        BETWEEN_AGENTS, "Agent to agent: checked by the lobby, then forwarded without auth_token."
    ),
}

_SUMMARIES: Final = {
    T.REGISTER: "Register (or resume, with auth_token) an agent and its capabilities.",
    T.REGISTER_ACK: "Registration accepted: carries the agent's token.",
    T.DISCOVER_SERVICES: "Find capabilities by name, keywords or ranked search.",
    T.SERVICES_AVAILABLE: "The answer to DISCOVER_SERVICES.",
    T.REQUEST: "Call a capability of another agent.",
    T.RESPONSE: "Answer a REQUEST; status `in_progress` keeps the conversation open.",
    T.ERROR: "A refused message: nothing was routed or changed.",
    T.UPDATE_CAPABILITIES: "Replace the sender's capabilities.",
    T.UNREGISTER: "Remove the agent and its token; the connection is closed with 4003.",
    T.ACK: "Every message delivered with seq <= up_to is processed.",
    T.ACCEPTED: "The named message and all sent before it are durably stored.",
    T.CFP: "Call for proposals: starts a dialogue.",
    T.PROPOSE: "A proposal, or a counter-proposal.",
    T.ACCEPT: "Accept the latest proposal.",
    T.DECLINE: "End the dialogue without a deal.",
    T.MATCH_ACCEPT: "Confirm an ACCEPT: the deal is made.",
    T.TRANSACTION_CONFIRMED: "The lobby recorded the dialogue's trade (to both parties).",
    T.DIALOGUE_EXPIRED: "The lobby ended an idle dialogue (to both parties).",
    T.BIDS_REVEALED: "A sealed round's held proposals, revealed at once (to its buyer).",
    T.LIST_TRANSACTIONS: "Ask for the ledger entries the sender is party to.",
    T.TRANSACTIONS: "The answer to LIST_TRANSACTIONS.",
    T.TEXT: "Free text between agents.",
    T.ORDER_PROPOSAL: "A priced order; its message_id is what a PAYMENT names.",
    T.PAYMENT: "Pay an ORDER_PROPOSAL.",
    T.PAYMENT_CONFIRMED: "The lobby recorded a payment (to both parties).",
    T.FETCH_MESSAGES: "Pull held messages after a cursor (and acknowledge up to it).",
    T.MESSAGES: "The answer to FETCH_MESSAGES.",
}


def component_schemas() -> dict[str, Any]:
    """Every schema the document names: the envelope (`Message`), each payload model and what
    they use, keyed by model name; references point into `#/components/schemas/`."""
    adapters: list[tuple[str, TypeAdapter[Any]]] = [("Message", TypeAdapter(Message))]
    adapters += [(t.value, TypeAdapter(m)) for t, m in PAYLOAD_MODELS.items()]
    mode: JsonSchemaMode = "validation"
    inputs = [(key, mode, adapter) for key, adapter in adapters]
    _, top = TypeAdapter.json_schemas(inputs, ref_template=_SCHEMAS + "{model}")
    schemas: dict[str, Any] = top["$defs"]
    return dict(sorted(schemas.items()))


def _message(message_type: MessageType) -> dict[str, Any]:
    payload_model = PAYLOAD_MODELS[message_type].__name__
    doc = (PAYLOAD_MODELS[message_type].__doc__ or "").strip()
    description = _DIRECTION[message_type] + (f" {doc}" if doc else "")
    return {
        "name": message_type.value,
        "title": message_type.value,
        "summary": _SUMMARIES[message_type],
        "description": description,
        "contentType": "application/json",
        "correlationId": {"$ref": "#/components/correlationIds/conversation"},
        "payload": {
            "allOf": [
                {"$ref": _SCHEMAS + "Message"},
                {
                    "type": "object",
                    "properties": {
                        "message_type": {"const": message_type.value, "type": "string"},
                        "payload": {"$ref": _SCHEMAS + payload_model},
                    },
                },
            ]
        },
    }


def _ref(message_type: MessageType) -> dict[str, str]:
    return {"$ref": f"#/channels/{CHANNEL}/messages/{message_type.value}"}


def _operations() -> dict[str, Any]:
    channel = {"$ref": f"#/channels/{CHANNEL}"}
    operations: dict[str, Any] = {}
    for message_type in (*TO_LOBBY, *BETWEEN_AGENTS):
        operation: dict[str, Any] = {
            "action": "receive",
            "channel": channel,
            "summary": f"An agent sends {message_type.value}.",
            "messages": [_ref(message_type)],
        }
        replies = REPLIES.get(message_type)
        if replies:
            operation["reply"] = {"channel": channel, "messages": [_ref(r) for r in replies]}
        operations[f"receive{message_type.value}"] = operation
    for message_type in (*FROM_LOBBY, *BETWEEN_AGENTS):
        operations[f"send{message_type.value}"] = {
            "action": "send",
            "channel": channel,
            "summary": f"The lobby delivers {message_type.value} to its receiver.",
            "messages": [_ref(message_type)],
        }
    return operations


_DESCRIPTION: Final = (
    "Agents register, discover each other, call each other's capabilities, negotiate (FIPA "
    "dialogues) and pay, through one WebSocket endpoint. Every frame is one JSON object in one "
    "text frame: the envelope (`Message`) with a `payload` that depends on `message_type`. The "
    "first message of a connection is REGISTER; REGISTER_ACK carries the agent's `auth_token`, "
    "which every later message must carry (the lobby strips it from everything it forwards). "
    f"Messages to the lobby have `receiver_id: {LOBBY_ID!r}`. The prose is PROTOCOL.md; this "
    "document is generated from protocol/models.py and payloads.py by `lobby asyncapi`."
)


def asyncapi_document() -> dict[str, Any]:
    """The AsyncAPI 3.0 document of the whole protocol, as a JSON-ready dict."""
    return {
        "asyncapi": ASYNCAPI_VERSION,
        "id": "urn:agent-lobby:protocol",
        "info": {
            "title": "Agent Lobby Protocol",
            "version": PROTOCOL_VERSION,
            "description": _DESCRIPTION,
            "license": {"name": "MIT"},
        },
        "defaultContentType": "application/json",
        "servers": {
            "local": {
                "host": "127.0.0.1:8765",
                "protocol": "ws",
                "description": "`lobby serve` with its defaults.",
            },
            "tls": {
                "host": "{host}:{port}",
                "protocol": "wss",
                "description": "`lobby serve --tls-cert ... --tls-key ...`.",
                "variables": {"host": {"default": "127.0.0.1"}, "port": {"default": "8765"}},
            },
        },
        "channels": {
            CHANNEL: {
                "address": "/",
                "title": "The lobby's WebSocket endpoint",
                "description": "Every message type travels on this one connection.",
                "messages": {t.value: {"$ref": f"#/components/messages/{t.value}"} for t in T},
            }
        },
        "operations": _operations(),
        "components": {
            "schemas": component_schemas(),
            "messages": {t.value: _message(t) for t in T},
            "correlationIds": {
                "conversation": {
                    "description": "REQUEST/RESPONSE and dialogue moves share a conversation_id.",
                    "location": "$message.payload#/conversation_id",
                }
            },
        },
    }
