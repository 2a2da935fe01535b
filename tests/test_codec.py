"""protocol.codec: frames to Messages and back, and the sentence for every malformed frame."""

from __future__ import annotations

import pytest

from protocol import DecodeError, Message, MessageType, decode, encode

GOOD = (
    '{"sender_id": "a", "receiver_id": "b", "message_type": "REQUEST",'
    ' "payload": {"capability_name": "c"}, "conversation_id": "k", "auth_token": "t"}'
)


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
