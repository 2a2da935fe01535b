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

from protocol.models import AGENT_ID_PATTERN, LOBBY_ID, Message, MessageType
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
    T.WATCH,
    T.UNWATCH,
    T.CANCEL,
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
    T.PRESENCE,
    T.CANCEL,
)
"""Messages the lobby sends; an agent that sends one of them gets ERROR `malformed` (but
CANCEL, which goes both ways: a requester's to the lobby, the lobby's to a provider)."""

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
    T.INPUT,
)
"""Messages from one agent to another: checked by the lobby, then forwarded (or held)."""

REPLIES: Final[dict[MessageType, tuple[MessageType, ...]]] = {
    T.REGISTER: (T.REGISTER_ACK, T.ERROR),
    T.DISCOVER_SERVICES: (T.SERVICES_AVAILABLE, T.ERROR),
    T.FETCH_MESSAGES: (T.MESSAGES, T.ERROR),
    T.LIST_TRANSACTIONS: (T.TRANSACTIONS, T.ERROR),
    T.REQUEST: (T.RESPONSE, T.ERROR),
    T.WATCH: (T.PRESENCE, T.ERROR),
}
"""What answers a message sent to the lobby; any other is answered only by an ERROR if refused
(an agent-to-agent move is answered by the other agent, not the lobby)."""

IN_CONVERSATION: Final = (
    T.REQUEST,
    T.CFP,
    T.PROPOSE,
    T.ACCEPT,
    T.DECLINE,
    T.MATCH_ACCEPT,
    T.WATCH,
    T.UNWATCH,
    T.INPUT,
)
"""Messages the lobby refuses without a `conversation_id` (a call's, or a dialogue's id)."""

_DIRECTION: Final = {
    **dict.fromkeys(TO_LOBBY, "Agent to lobby."),
    **dict.fromkeys(FROM_LOBBY, "Lobby to agent."),
    **dict.fromkeys(
        BETWEEN_AGENTS, "Agent to agent: checked by the lobby, then forwarded without auth_token."
    ),
    T.CANCEL: "Requester to lobby, and lobby to provider.",
}

_SUMMARIES: Final = {
    T.REGISTER: "Register (or resume, with auth_token) an agent and its capabilities.",
    T.REGISTER_ACK: "Registration accepted: carries the agent's token.",
    T.DISCOVER_SERVICES: "Find capabilities by name, keywords or ranked search.",
    T.SERVICES_AVAILABLE: "The answer to DISCOVER_SERVICES.",
    T.REQUEST: "Call a capability of another agent (or, to global_lobby, of any provider).",
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
    T.WATCH: "Watch a capability or agents: PRESENCE now and at every change.",
    T.UNWATCH: "End the watch the conversation_id names.",
    T.PRESENCE: "An agent as it is (snapshot) or as it changed; never stored or replayed.",
    T.CANCEL: "End the sender's open REQUESTs in a conversation; to a provider: stop working.",
    T.INPUT: "The requester's answer to a RESPONSE's `input_required` (multi-turn).",
}


def _camel(message_type: MessageType) -> str:
    """`REGISTER_ACK` -> `RegisterAck`: the name generators turn into types and methods."""
    return "".join(part.capitalize() for part in message_type.value.split("_"))


def sent_name(message_type: MessageType) -> str:
    """The frame an agent sends: `Register`, `Request`."""
    return _camel(message_type)


def delivered_name(message_type: MessageType) -> str:
    """The frame the lobby delivers: `RegisterAck`; for a message between agents, as its
    receiver gets it: `RequestDelivered`."""
    delivered = message_type in BETWEEN_AGENTS or message_type in TO_LOBBY
    return _camel(message_type) + ("Delivered" if delivered else "")


def _plain(schema: Any) -> Any:
    """Rewrite pydantic's `anyOf: [T, null]` as generators understand it: `type: [T, "null"]`
    for a scalar (a pointer in Go, an optional in TypeScript and Python); the bare type for a
    list, a map or a model (the field is optional: omit it rather than send null)."""
    if isinstance(schema, list):
        return [_plain(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    schema = {key: _plain(value) for key, value in schema.items()}
    branches = schema.get("anyOf")
    if isinstance(branches, list) and {"type": "null"} in branches and len(branches) == 2:
        (other,) = (branch for branch in branches if branch != {"type": "null"})
        del schema["anyOf"]
        if "$ref" in other:
            schema.pop("default", None)
            return {**schema, **other}
        if other.get("type") in ("array", "object"):
            return {**schema, **other}  # generated code iterates these without a null check
        if isinstance(other.get("type"), str):
            return {**schema, **other, "type": [other["type"], "null"]}
        schema["anyOf"] = [*other["anyOf"], {"type": "null"}] if "anyOf" in other else branches
    return schema


def component_schemas() -> dict[str, Any]:
    """Every schema the document names: the envelope (`Message`), each payload model and what
    they use, keyed by model name, then each frame by direction (`frame_schemas`); references
    point into `#/components/schemas/`."""
    adapters: list[tuple[str, TypeAdapter[Any]]] = [("Message", TypeAdapter(Message))]
    adapters += [(t.value, TypeAdapter(m)) for t, m in PAYLOAD_MODELS.items()]
    mode: JsonSchemaMode = "validation"
    inputs = [(key, mode, adapter) for key, adapter in adapters]
    _, top = TypeAdapter.json_schemas(inputs, ref_template=_SCHEMAS + "{model}")
    schemas: dict[str, Any] = _plain(top["$defs"])
    schemas.update(frame_schemas(schemas["Message"]))
    return dict(sorted(schemas.items()))


def _frame(
    envelope: dict[str, Any], message_type: MessageType, *, sent: bool, title: str
) -> dict[str, Any]:
    """One message type's whole frame as one flat object with a named payload, so that a
    generator makes one model per frame. What an agent sends carries `auth_token` (all but
    REGISTER); what the lobby delivers never does, and has a `message_id` (but ACCEPTED)."""
    properties = dict(envelope["properties"])
    properties["message_type"] = {"$ref": _SCHEMAS + _camel(message_type) + "Type"}
    properties["payload"] = {"$ref": _SCHEMAS + PAYLOAD_MODELS[message_type].__name__}
    required = ["sender_id", "receiver_id", "message_type", "payload"]
    if message_type in IN_CONVERSATION:
        required.append("conversation_id")
        properties["conversation_id"] = {**properties["conversation_id"], "type": "string"}
    if sent:
        for lobby_only in ("seq", "redelivered", "deadline"):
            del properties[lobby_only]
        # The agent id it registers (or registered) under, as the lobby checks it.
        properties["sender_id"] = {**properties["sender_id"], "pattern": AGENT_ID_PATTERN}
        if message_type is not T.REGISTER:
            required.append("auth_token")
            properties["auth_token"] = {**properties["auth_token"], "type": "string"}
    else:
        del properties["auth_token"]
        del properties["timeout_ms"]  # the lobby forwards it as `deadline`
        if message_type is not T.ACCEPTED:  # a bare confirmation, numbered by nothing
            required.append("message_id")
            properties["message_id"] = {**properties["message_id"], "type": "string"}
    to_lobby = message_type in TO_LOBBY
    from_lobby = message_type in FROM_LOBBY
    if (to_lobby and sent) or (from_lobby and not sent):
        properties["receiver_id" if sent else "sender_id"] = {"$ref": _SCHEMAS + "LobbyId"}
    return {
        "title": title,
        "description": f"{_DIRECTION[message_type]} {_SUMMARIES[message_type]}",
        "type": "object",
        "properties": properties,
        "required": required,
    }


def frame_schemas(envelope: dict[str, Any]) -> dict[str, Any]:
    """A schema per frame and direction, and the two unions a reader dispatches on by
    `message_type`: `AgentFrame` (any frame an agent sends) and `LobbyFrame` (any frame the
    lobby sends). A message between agents has one of each: `Request` as sent, and
    `RequestDelivered` as its receiver gets it."""
    # Single-value enums rather than `const`: every generator makes a type of them that
    # parses and writes the value (Modelina's pydantic output breaks on a string const).
    frames: dict[str, Any] = {
        f"{_camel(t)}Type": {"title": f"{_camel(t)}Type", "type": "string", "enum": [t.value]}
        for t in T
    }
    frames["LobbyId"] = {
        "title": "LobbyId",
        "description": "The lobby's own id, as sender or receiver.",
        "type": "string",
        "enum": [LOBBY_ID],
    }
    for message_type in (*TO_LOBBY, *BETWEEN_AGENTS):
        name = sent_name(message_type)
        frames[name] = _frame(envelope, message_type, sent=True, title=name)
    for message_type in (*FROM_LOBBY, *BETWEEN_AGENTS):
        name = delivered_name(message_type)
        frames[name] = _frame(envelope, message_type, sent=False, title=name)
    for union, types, name_of in (
        ("AgentFrame", (*TO_LOBBY, *BETWEEN_AGENTS), sent_name),
        ("LobbyFrame", (*FROM_LOBBY, *BETWEEN_AGENTS), delivered_name),
    ):
        frames[union] = {
            "title": union,
            "description": "Any frame of this direction; `message_type` says which.",
            "oneOf": [{"$ref": _SCHEMAS + name_of(t)} for t in types],
            "discriminator": "message_type",
        }
    return frames


def _message(name: str, message_type: MessageType) -> dict[str, Any]:
    doc = (PAYLOAD_MODELS[message_type].__doc__ or "").strip()
    description = _DIRECTION[message_type] + (f" {doc}" if doc else "")
    return {
        "name": name,
        "title": message_type.value,
        "summary": _SUMMARIES[message_type],
        "description": description,
        "contentType": "application/json",
        "correlationId": {"$ref": "#/components/correlationIds/conversation"},
        "payload": {"$ref": _SCHEMAS + name},
    }


def _messages() -> dict[str, Any]:
    """Every message, by frame name: what agents send, then what the lobby sends."""
    messages = {sent_name(t): _message(sent_name(t), t) for t in (*TO_LOBBY, *BETWEEN_AGENTS)}
    for message_type in (*FROM_LOBBY, *BETWEEN_AGENTS):
        name = delivered_name(message_type)
        messages[name] = _message(name, message_type)
    return messages


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/channels/{CHANNEL}/messages/{name}"}


def _operations(view: str) -> dict[str, Any]:
    """One operation per message and direction, from the `view` ("lobby" or "agent") of the
    application the document describes: the lobby receives what agents send and answers some
    of it directly (`reply`); an agent sends those and receives what the lobby sends."""
    channel = {"$ref": f"#/channels/{CHANNEL}"}
    agent = view == "agent"
    operations: dict[str, Any] = {}
    for message_type in (*TO_LOBBY, *BETWEEN_AGENTS):
        name = sent_name(message_type)
        operation: dict[str, Any] = {
            "action": "send" if agent else "receive",
            "channel": channel,
            "summary": f"An agent sends {message_type.value}.",
            "messages": [_ref(name)],
        }
        replies = REPLIES.get(message_type)
        if replies:
            answers = [_ref(delivered_name(r)) for r in replies]
            operation["reply"] = {"channel": channel, "messages": answers}
        operations[("send" if agent else "receive") + name] = operation
    for message_type in (*FROM_LOBBY, *BETWEEN_AGENTS):
        name = delivered_name(message_type)
        operations[("receive" if agent else "send") + name] = {
            "action": "receive" if agent else "send",
            "channel": channel,
            "summary": f"The lobby delivers {message_type.value} to its receiver.",
            "messages": [_ref(name)],
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


VIEWS: Final = ("lobby", "agent")
"""The application a document describes: the lobby (`protocol/asyncapi.json`), or an agent
(`protocol/asyncapi-agent.json`, from which a generator makes an agent-side client)."""

# A client generator names its class after the title less its spaces (@asyncapi/generator's
# client templates): the agent's title has to make an identifier that way.
_VIEW_TITLES: Final = {"lobby": "Agent Lobby Protocol", "agent": "Lobby Agent"}
_VIEW_DESCRIPTIONS: Final = {
    "lobby": " This document describes the lobby; `protocol/asyncapi-agent.json` describes the "
    "same messages from an agent's side.",
    "agent": " This document describes an agent (it sends REGISTER, receives REGISTER_ACK); "
    "`protocol/asyncapi.json` describes the same messages from the lobby's side.",
}


def asyncapi_document(view: str = "lobby") -> dict[str, Any]:
    """The AsyncAPI 3.0 document of the whole protocol from `view`'s side, as a JSON-ready
    dict. Both views share every schema and message; only the operations' actions differ."""
    return {
        "asyncapi": ASYNCAPI_VERSION,
        "id": f"urn:agent-lobby:protocol:{view}",
        "info": {
            "title": _VIEW_TITLES[view],
            "version": PROTOCOL_VERSION,
            "description": _DESCRIPTION + _VIEW_DESCRIPTIONS[view],
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
                "messages": {
                    name: {"$ref": f"#/components/messages/{name}"} for name in _messages()
                },
            }
        },
        "operations": _operations(view),
        "components": {
            "schemas": component_schemas(),
            "messages": _messages(),
            "correlationIds": {
                "conversation": {
                    "description": "REQUEST/RESPONSE and dialogue moves share a conversation_id.",
                    "location": "$message.payload#/conversation_id",
                }
            },
        },
    }
