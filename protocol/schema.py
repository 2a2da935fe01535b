"""JSON Schemas of every message, generated from the models (`lobby schema` prints them).

One document per message type: the envelope with `message_type` fixed and `payload` replaced by
that type's payload model. The committed copies in `protocol/schema/` are kept equal to these
by a test, so a third-party implementer can read them straight from the repository.
"""

from __future__ import annotations

from typing import Any, Final

from pydantic import TypeAdapter

from protocol.models import Message, MessageType
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
    return {
        "$schema": SCHEMA_DIALECT,
        "$id": f"{message_type.value}.json",
        "title": message_type.value,
        "type": "object",
        "properties": properties,
        "required": envelope["required"],
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
