"""protocol.codec: frames to Messages and back, and the sentence for every malformed frame."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from protocol import DecodeError, Message, MessageType, decode, encode
from protocol.limits import MAX_AGENT_ID_LENGTH, MAX_ID_LENGTH

GOOD = (
    '{"sender_id": "a", "receiver_id": "b", "message_type": "REQUEST",'
    ' "payload": {"capability_name": "c"}, "conversation_id": "k", "auth_token": "t"}'
)


TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def test_decode_reads_every_envelope_field() -> None:
    msg = decode(GOOD)
    assert msg == Message(
        "a", "b", MessageType.REQUEST, {"capability_name": "c"}, "k", auth_token="t"
    )
    assert decode(GOOD.encode()) == msg


def test_unknown_top_level_fields_are_ignored() -> None:
    msg = decode(GOOD[:-1] + ', "colour": "blue"}')
    assert msg.conversation_id == "k"
    assert b"colour" not in encode(msg)


def test_encode_round_trips_and_leaves_unset_fields_out() -> None:
    msg = Message("a", "b", MessageType.RESPONSE, {"status": "success"}, seq=3)
    frame = encode(msg)
    assert b"auth_token" not in frame
    assert b"in_reply_to" not in frame
    assert decode(frame) == msg


@pytest.mark.parametrize(
    ("frame", "problem"),
    [
        ("{nope", "invalid JSON"),
        ("[1, 2]", "a message must be a JSON object, not an array"),
        ('"text"', "not a string"),
        ('{"sender_id": "a", "receiver_id": "b", "payload": {}}', "missing field 'message_type'"),
        (
            '{"sender_id": "a", "receiver_id": "b", "message_type": 7, "payload": {}}',
            "field 'message_type' must be a string, not a number",
        ),
        (
            '{"sender_id": "a", "receiver_id": "b", "message_type": "HELLO", "payload": {}}',
            "unknown message_type 'HELLO'",
        ),
        (
            '{"receiver_id": "b", "message_type": "ERROR", "payload": {}}',
            "missing field 'sender_id'",
        ),
        (
            '{"sender_id": "a", "message_type": "ERROR", "payload": {}}',
            "missing field 'receiver_id'",
        ),
        (
            '{"sender_id": "a", "receiver_id": "b", "message_type": "ERROR"}',
            "missing field 'payload'",
        ),
        (
            '{"sender_id": 1, "receiver_id": "b", "message_type": "ERROR", "payload": {}}',
            "field 'sender_id' must be a string, not a number",
        ),
        (
            '{"sender_id": "a", "receiver_id": "b", "message_type": "ERROR", "payload": []}',
            "field 'payload' must be an object, not an array",
        ),
        (
            '{"sender_id": "a", "receiver_id": "b", "message_type": "ERROR", "payload": {},'
            ' "conversation_id": 5}',
            "field 'conversation_id' must be a string or null, not a number",
        ),
        (
            '{"sender_id": "a", "receiver_id": "b", "message_type": "ERROR", "payload": {},'
            ' "seq": "x"}',
            "field 'seq' must be an integer or null, not a string",
        ),
    ],
)
def test_every_malformed_frame_is_named(frame: str, problem: str) -> None:
    with pytest.raises(DecodeError) as refused:
        decode(frame)
    assert problem in str(refused.value)


def test_decode_error_keeps_what_it_could_read() -> None:
    with pytest.raises(DecodeError) as refused:
        decode('{"message_type": "REQUEST", "conversation_id": "k", "payload": {}}')
    assert refused.value.message_type == "REQUEST"
    assert refused.value.conversation_id == "k"


def envelope(**fields: Any) -> str:
    """A REQUEST frame with `fields` changed (None: the field left out)."""
    frame: dict[str, Any] = {
        "sender_id": "a",
        "receiver_id": "b",
        "message_type": "REQUEST",
        "payload": {},
        "conversation_id": "k",
    }
    frame.update(fields)
    return orjson.dumps({k: v for k, v in frame.items() if v is not None}).decode()


@pytest.mark.parametrize(
    ("fields", "problem"),
    [
        ({"message_type": None}, "missing field 'message_type'"),
        ({"message_type": True}, "field 'message_type' must be a string, not a boolean"),
        ({"message_type": "HELLO"}, "unknown message_type 'HELLO'"),
        ({"sender_id": None}, "missing field 'sender_id'"),
        ({"sender_id": False}, "field 'sender_id' must be a string, not a boolean"),
        ({"receiver_id": {}}, "field 'receiver_id' must be a string, not an object"),
        ({"payload": "x"}, "field 'payload' must be an object, not a string"),
        ({"auth_token": 5}, "field 'auth_token' must be a string or null, not a number"),
        ({"message_id": []}, "field 'message_id' must be a string or null, not an array"),
        ({"in_reply_to": 1.5}, "field 'in_reply_to' must be a string or null, not a number"),
        ({"seq": "1"}, "field 'seq' must be an integer or null, not a string"),
        ({"redelivered": "yes"}, "field 'redelivered' must be a boolean or null, not a string"),
        ({"redelivered": 1}, "field 'redelivered' must be a boolean or null, not a number"),
        ({"sender_id": "s" * 129}, "field 'sender_id' has 129 characters; at most 128 are allowed"),
        (
            {"receiver_id": "r" * 129},
            "field 'receiver_id' has 129 characters; at most 128 are allowed",
        ),
        (
            {"auth_token": "t" * 257},
            "field 'auth_token' has 257 characters; at most 256 are allowed",
        ),
        (
            {"message_id": "m" * 257},
            "field 'message_id' has 257 characters; at most 256 are allowed",
        ),
        (
            {"in_reply_to": "i" * 257},
            "field 'in_reply_to' has 257 characters; at most 256 are allowed",
        ),
        # Only the field that breaks a rule is named, not a valid one before it:
        (
            {"seq": 3, "redelivered": True, "message_id": "m" * 257},
            "field 'message_id' has 257 characters; at most 256 are allowed",
        ),
        (
            {"sender_id": "s" * 128, "auth_token": "t" * 256, "in_reply_to": "i" * 257},
            "field 'in_reply_to' has 257 characters; at most 256 are allowed",
        ),
    ],
)
def test_a_malformed_frame_is_named_and_keeps_its_type_and_conversation(
    fields: dict[str, Any], problem: str
) -> None:
    with pytest.raises(DecodeError) as refused:
        decode(envelope(**fields))
    assert refused.value.reason == problem
    raw_type = fields.get("message_type", "REQUEST")
    assert refused.value.message_type == (raw_type if type(raw_type) is str else None)
    assert refused.value.conversation_id == "k"


def test_a_null_field_is_named_null() -> None:
    with pytest.raises(DecodeError) as refused:
        decode('{"sender_id": null, "receiver_id": "b", "message_type": "ERROR", "payload": {}}')
    assert refused.value.reason == "field 'sender_id' must be a string, not null"


def test_a_too_long_conversation_id_is_refused_and_not_echoed() -> None:
    """An ERROR's conversation_id is a valid id or absent: an echo of an invalid one would break
    the schema that every ERROR is checked against."""
    long_id = "c" * 257
    with pytest.raises(DecodeError) as refused:
        decode(envelope(conversation_id=long_id, message_id="m1"))
    assert refused.value.reason == (
        "field 'conversation_id' has 257 characters; at most 256 are allowed"
    )
    assert (refused.value.conversation_id, refused.value.message_id) == (None, "m1")


def test_valid_ids_come_back_whole_with_the_error() -> None:
    conversation_id, message_id = "c" * MAX_ID_LENGTH, "m" * MAX_ID_LENGTH
    with pytest.raises(DecodeError) as refused:
        decode(envelope(conversation_id=conversation_id, message_id=message_id, seq="x"))
    assert refused.value.conversation_id == conversation_id
    assert refused.value.message_id == message_id


def test_every_field_at_its_length_limit_is_accepted() -> None:
    ids = {name: name[0] * MAX_ID_LENGTH for name in ("auth_token", "message_id", "in_reply_to")}
    msg = decode(
        envelope(
            sender_id="s" * MAX_AGENT_ID_LENGTH,
            receiver_id="r" * MAX_AGENT_ID_LENGTH,
            conversation_id="c" * MAX_ID_LENGTH,
            **ids,
        )
    )
    assert len(msg.sender_id) == len(msg.receiver_id) == MAX_AGENT_ID_LENGTH
    assert msg.conversation_id == "c" * MAX_ID_LENGTH
    assert (msg.auth_token, msg.message_id, msg.in_reply_to) == tuple(ids.values())


def test_every_field_survives_encode_and_decode() -> None:
    msg = Message(
        "a",
        "b",
        MessageType.PROPOSE,
        {"proposal": {"price": 1}},
        "k",
        auth_token="t",
        message_id="m",
        in_reply_to="r",
        seq=7,
        redelivered=True,
        traceparent=TRACEPARENT,
    )
    assert orjson.loads(encode(msg)) == {
        "sender_id": "a",
        "receiver_id": "b",
        "message_type": "PROPOSE",
        "payload": {"proposal": {"price": 1}},
        "conversation_id": "k",
        "auth_token": "t",
        "message_id": "m",
        "in_reply_to": "r",
        "seq": 7,
        "redelivered": True,
        "traceparent": TRACEPARENT,
    }
    assert decode(encode(msg)) == msg
    assert decode(envelope(redelivered=False)).redelivered is False


def test_a_w3c_traceparent_is_read_in_any_version_but_ff() -> None:
    assert decode(envelope(traceparent=TRACEPARENT)).traceparent == TRACEPARENT
    later = "cc" + TRACEPARENT[2:] + "-what-a-later-version-adds"
    assert decode(envelope(traceparent=later)).traceparent == later
    longest = later + "x" * (MAX_ID_LENGTH - len(later))  # exactly at the id limit
    assert decode(envelope(traceparent=longest)).traceparent == longest


@pytest.mark.parametrize(
    ("traceparent", "problem"),
    [
        (5, "field 'traceparent' must be a string or null, not a number"),
        ("abc", "is not a W3C traceparent"),
        (TRACEPARENT.upper(), "is not a W3C traceparent"),
        (TRACEPARENT[:-1], "is not a W3C traceparent"),
        ("ff" + TRACEPARENT[2:], "has version ff"),
        (TRACEPARENT + "-x", "must be exactly 55 characters"),
        (f"00-{'0' * 32}-00f067aa0ba902b7-01", "has an all-zero trace-id"),
        (f"00-4bf92f3577b34da6a3ce929d0e0e4736-{'0' * 16}-01", "has an all-zero parent-id"),
        ("cc" + TRACEPARENT[2:] + "-" + "x" * MAX_ID_LENGTH, "at most"),
    ],
)
def test_a_malformed_traceparent_is_named(traceparent: Any, problem: str) -> None:
    with pytest.raises(DecodeError) as refused:
        decode(envelope(traceparent=traceparent))
    assert "'traceparent'" in str(refused.value)
    assert problem in str(refused.value)
    assert refused.value.conversation_id == "k"
