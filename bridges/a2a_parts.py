"""What a lobby payload is in A2A terms, and back: pure conversions both A2A bridges share.

A REQUEST's payload travels as one A2A data part; the capability it calls is the message's
`metadata.skill` (an A2A skill id is a capability name), else the payload's `capability_name`
(else the gateway's default: its agent's sole capability). A message with text only carries
`{"text": ...}`, or the JSON object the text is.
"""

from __future__ import annotations

from typing import Any

import orjson
from a2a.helpers import get_data_parts, get_text_parts, new_data_part
from a2a.types import Message, Part
from google.protobuf.json_format import MessageToDict


def payload_of(parts: list[Part]) -> dict[str, Any]:
    """The lobby payload A2A parts carry: the first data part that is an object, else the
    text as a JSON object, else `{"text": text}`."""
    for data in get_data_parts(parts):
        if isinstance(data, dict):
            return dict(_whole_numbers(data))
    text = "\n".join(get_text_parts(parts))
    try:
        decoded = orjson.loads(text)
    except orjson.JSONDecodeError:
        decoded = None
    return decoded if isinstance(decoded, dict) else {"text": text}


def skill_of(message: Message) -> str | None:
    """The skill (capability) a message names in its metadata, if it names one."""
    skill = MessageToDict(message.metadata).get("skill") if message.HasField("metadata") else None
    return skill if isinstance(skill, str) and skill else None


def named_capability(message: Message) -> str | None:
    """The capability a message names: its `metadata.skill`, else its payload's
    `capability_name`; None when it names none (generic A2A clients never do)."""
    named = skill_of(message) or payload_of(list(message.parts)).get("capability_name")
    return named if isinstance(named, str) and named else None


def data_parts(payload: dict[str, Any]) -> list[Part]:
    """A lobby payload as A2A parts (one data part)."""
    return [new_data_part(payload)]


def _whole_numbers(value: Any) -> Any:
    """protobuf's Value holds every number as a double: give whole numbers back as int, since
    a capability's schema or model may ask for an integer."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        return {key: _whole_numbers(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_whole_numbers(item) for item in value]
    return value
