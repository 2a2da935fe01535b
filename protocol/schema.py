"""JSON Schemas of every message, generated from the models (`lobby schema` prints them).

One document per message type: the envelope with `message_type` fixed and `payload` replaced by
that type's payload model. The committed copies in `protocol/schema/` are kept equal to these
by a test, so a third-party implementer can read them straight from the repository.
"""

from __future__ import annotations

from typing import Any, Final

from pydantic import TypeAdapter

from protocol.asyncapi import FROM_LOBBY, IN_CONVERSATION, TO_LOBBY
from protocol.models import AGENT_ID_PATTERN, LOBBY_ID, Message, MessageType
from protocol.payloads import PAYLOAD_MODELS, Capability

SCHEMA_DIALECT: Final = "https://json-schema.org/draft/2020-12/schema"


def envelope_schema() -> dict[str, Any]:
    schema = TypeAdapter(Message).json_schema()
    schema["title"] = "Message"
    schema["description"] = (
        "The envelope every frame carries. Unknown top-level fields are ignored; "
        "`seq` and `redelivered` are set by the lobby on delivery only."
    )
    return schema


def message_schema(message_type: MessageType) -> dict[str, Any]:
    """The schema of one whole frame of `message_type`."""
    envelope = envelope_schema()
    payload = TypeAdapter(PAYLOAD_MODELS[message_type]).json_schema(ref_template="#/$defs/{model}")
    defs: dict[str, Any] = {**envelope.pop("$defs", {}), **payload.pop("$defs", {})}
    properties = dict(envelope["properties"])
    properties["message_type"] = {"const": message_type.value, "type": "string"}
    properties["payload"] = payload
    # The rules the lobby holds a frame of this type to (protocol/asyncapi.py has them per
    # direction): an agent's id as sender, the lobby as receiver, a conversation to belong to.
    properties["sender_id"] = {**properties["sender_id"], "pattern": AGENT_ID_PATTERN}
    if message_type in TO_LOBBY or message_type in FROM_LOBBY:
        lobby_end = "receiver_id" if message_type in TO_LOBBY else "sender_id"
        properties[lobby_end] = {**properties[lobby_end], "const": LOBBY_ID}
    required = list(envelope["required"])
    if message_type in IN_CONVERSATION:
        nullable = dict(properties["conversation_id"])
        (string,) = (b for b in nullable.pop("anyOf") if b != {"type": "null"})
        nullable.pop("default")
        properties["conversation_id"] = {**nullable, **string}
        required.append("conversation_id")
    return {
        "$schema": SCHEMA_DIALECT,
        "$id": f"{message_type.value}.json",
        "title": message_type.value,
        "type": "object",
        "properties": properties,
        "required": required,
        **({"$defs": defs} if defs else {}),
    }


def all_schemas() -> dict[str, dict[str, Any]]:
    """File name -> schema, for every message type plus the envelope and Capability."""
    schemas = {f"{t.value}.json": message_schema(t) for t in MessageType}
    schemas["Message.json"] = {"$schema": SCHEMA_DIALECT, **envelope_schema()}
    schemas["Capability.json"] = {
        "$schema": SCHEMA_DIALECT,
        **TypeAdapter(Capability).json_schema(),
    }
    return schemas
