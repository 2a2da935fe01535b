"""The only place frames become `Message`s and back: `decode` and `encode`, with orjson.

`decode` is on the lobby's hot path, so the common case is one `orjson.loads`, a handful of type
and length checks (`protocol.limits`) and one dataclass; only a frame that fails them takes the
slow path that explains exactly what is wrong (the sentence an agent gets back in its ERROR).
"""

from __future__ import annotations

from typing import Any, Final

import orjson

from protocol.errors import DecodeError
from protocol.limits import MAX_AGENT_ID_LENGTH, MAX_ID_LENGTH, MAX_TIMEOUT_MS, clip
from protocol.models import Message, MessageType
from protocol.tracecontext import problem as traceparent_problem

_TYPES: Final[dict[str, MessageType]] = {t.value: t for t in MessageType}
_REQUIRED: Final = (("sender_id", str), ("receiver_id", str), ("payload", dict))
_OPTIONAL_STR: Final = ("conversation_id", "auth_token", "message_id", "in_reply_to", "traceparent")
_MAX_LENGTHS: Final = (
    ("sender_id", MAX_AGENT_ID_LENGTH),
    ("receiver_id", MAX_AGENT_ID_LENGTH),
    *((name, MAX_ID_LENGTH) for name in _OPTIONAL_STR),
)
_JSON_NAMES: Final[dict[type, str]] = {
    str: "a string",
    dict: "an object",
    int: "an integer",
    bool: "a boolean",
}

_REQUEST: Final = MessageType.REQUEST

_loads = orjson.loads
_dumps = orjson.dumps


def decode(data: str | bytes) -> Message:
    """Parse one frame into a `Message`, or raise `DecodeError` naming the problem.

    Unknown top-level fields are ignored. Identifiers longer than `protocol.limits` allows are
    refused here, so nothing after decode ever holds (or logs) an unbounded id.
    """
    try:
        obj = _loads(data)
    except orjson.JSONDecodeError as exc:
        raise DecodeError(f"invalid JSON: {exc}") from None
    if type(obj) is not dict:
        raise DecodeError(f"a message must be a JSON object, not {_json_kind(obj)}")
    get = obj.get
    try:
        message_type = _TYPES[obj["message_type"]]
        sender_id = obj["sender_id"]
        receiver_id = obj["receiver_id"]
        payload = obj["payload"]
    except (KeyError, TypeError):
        raise _explain(obj) from None
    conversation_id = get("conversation_id")
    auth_token = get("auth_token")
    message_id = get("message_id")
    in_reply_to = get("in_reply_to")
    seq = get("seq")
    redelivered = get("redelivered")
    traceparent = get("traceparent")
    timeout_ms = get("timeout_ms")
    deadline = get("deadline")
    if (
        type(sender_id) is not str
        or len(sender_id) > MAX_AGENT_ID_LENGTH
        or type(receiver_id) is not str
        or len(receiver_id) > MAX_AGENT_ID_LENGTH
        or type(payload) is not dict
        or (
            conversation_id is not None
            and (type(conversation_id) is not str or len(conversation_id) > MAX_ID_LENGTH)
        )
        or (
            auth_token is not None
            and (type(auth_token) is not str or len(auth_token) > MAX_ID_LENGTH)
        )
        or (
            message_id is not None
            and (type(message_id) is not str or len(message_id) > MAX_ID_LENGTH)
        )
        or (
            in_reply_to is not None
            and (type(in_reply_to) is not str or len(in_reply_to) > MAX_ID_LENGTH)
        )
        or (seq is not None and type(seq) is not int)
        or (redelivered is not None and type(redelivered) is not bool)
        or (
            traceparent is not None
            and (
                type(traceparent) is not str
                or len(traceparent) > MAX_ID_LENGTH
                or traceparent_problem(traceparent) is not None
            )
        )
        or (
            timeout_ms is not None
            and (
                type(timeout_ms) is not int
                or not 1 <= timeout_ms <= MAX_TIMEOUT_MS
                or message_type is not _REQUEST
            )
        )
        or (deadline is not None and type(deadline) is not int)
    ):
        raise _explain(obj)
    return Message(
        sender_id,
        receiver_id,
        message_type,
        payload,
        conversation_id,
        auth_token,
        message_id,
        in_reply_to,
        seq,
        redelivered,
        traceparent,
        timeout_ms,
        deadline,
    )


def to_dict(message: Message) -> dict[str, Any]:
    """The JSON object of `message`, leaving out the fields that are not set."""
    out: dict[str, Any] = {
        "sender_id": message.sender_id,
        "receiver_id": message.receiver_id,
        "message_type": message.message_type,
        "payload": message.payload,
    }
    if message.conversation_id is not None:
        out["conversation_id"] = message.conversation_id
    if message.auth_token is not None:
        out["auth_token"] = message.auth_token
    if message.message_id is not None:
        out["message_id"] = message.message_id
    if message.in_reply_to is not None:
        out["in_reply_to"] = message.in_reply_to
    if message.seq is not None:
        out["seq"] = message.seq
    if message.redelivered is not None:
        out["redelivered"] = message.redelivered
    if message.traceparent is not None:
        out["traceparent"] = message.traceparent
    if message.timeout_ms is not None:
        out["timeout_ms"] = message.timeout_ms
    if message.deadline is not None:
        out["deadline"] = message.deadline
    return out


def encode(message: Message) -> bytes:
    """Serialize `message` to the UTF-8 JSON bytes of one text frame."""
    return _dumps(to_dict(message))


def _valid_id(value: object) -> str | None:
    return value if type(value) is str and len(value) <= MAX_ID_LENGTH else None


def _explain(obj: dict[str, Any]) -> DecodeError:
    """The precise error for an object that failed `decode`'s fast checks.

    What it echoes: the message type clipped like any quoted string; the conversation id and
    the message id only when they are valid ids (whole, so the agent can match the ERROR)."""
    raw_type = obj.get("message_type")
    context: dict[str, Any] = {
        "message_type": clip(raw_type) if type(raw_type) is str else None,
        "conversation_id": _valid_id(obj.get("conversation_id")),
        "message_id": _valid_id(obj.get("message_id")),
    }
    if "message_type" not in obj:
        return DecodeError("missing field 'message_type'", **context)
    if type(raw_type) is not str:
        return DecodeError(
            f"field 'message_type' must be a string, not {_json_kind(raw_type)}", **context
        )
    if raw_type not in _TYPES:
        return DecodeError(f"unknown message_type {clip(raw_type)!r}", **context)
    kind: type
    for name, kind in _REQUIRED:
        if name not in obj:
            return DecodeError(f"missing field {name!r}", **context)
        if type(obj[name]) is not kind:
            return DecodeError(
                f"field {name!r} must be {_JSON_NAMES[kind]}, not {_json_kind(obj[name])}",
                **context,
            )
    for name in _OPTIONAL_STR:
        value = obj.get(name)
        if value is not None and type(value) is not str:
            return DecodeError(
                f"field {name!r} must be a string or null, not {_json_kind(value)}", **context
            )
    lobby_set: tuple[tuple[str, type], ...] = (
        ("seq", int),
        ("redelivered", bool),
        ("timeout_ms", int),
        ("deadline", int),
    )
    for name, kind in lobby_set:
        value = obj.get(name)
        if value is not None and type(value) is not kind:
            return DecodeError(
                f"field {name!r} must be {_JSON_NAMES[kind]} or null, not {_json_kind(value)}",
                **context,
            )
    for name, limit in _MAX_LENGTHS:
        value = obj.get(name)
        if value is not None and len(value) > limit:
            return DecodeError(
                f"field {name!r} has {len(value)} characters; at most {limit} are allowed",
                **context,
            )
    timeout_ms = obj.get("timeout_ms")
    if timeout_ms is not None:
        if raw_type != _REQUEST:
            return DecodeError(
                f"field 'timeout_ms' is for a REQUEST only, not {raw_type}", **context
            )
        if not 1 <= timeout_ms <= MAX_TIMEOUT_MS:
            return DecodeError(
                f"field 'timeout_ms' is {timeout_ms}; it must be 1 to {MAX_TIMEOUT_MS} "
                "(milliseconds)",
                **context,
            )
    traceparent = obj.get("traceparent")
    if traceparent is not None and (wrong := traceparent_problem(traceparent)) is not None:
        return DecodeError(f"field 'traceparent' {wrong}", **context)
    return DecodeError("the message does not fit the envelope", **context)  # pragma: no cover


def _json_kind(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "an object"
