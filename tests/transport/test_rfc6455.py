"""What RFC 6455 asks a receiver to check, on both transports behind the real lobby: a text
message that is not UTF-8 closes the connection with 1007 (8.1), fragments out of order and
close codes no peer may send close it with 1002 (5.4, 7.4), valid close codes are echoed.
Raw frames over a real socket; the checks themselves also synchronously."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest
from websockets.frames import Close, Frame, Opcode

from lobby.server import LobbyServer
from lobby.transport.rfc6455 import (
    Utf8Stream,
    lone_close_frame,
    sendable_close_code,
    valid_utf8,
)
from tests.conftest import TRANSPORTS
from tests.transport.test_framing import RawClient, masked, texts
from tests.wsclient import frame, running

CUT = "é".encode()  # two bytes: a fragment boundary between them is no error
INVALID_CLOSE_CODES = [0, 999, 1004, 1005, 1006, 1015, 1016, 2999, 5000]
VALID_CLOSE_CODES = [1000, 3000, 4999]


async def answer_to(lobby: LobbyServer, *frames: bytes) -> tuple[list[bytes], int | None]:
    """Write `frames` on a fresh connection and read to the end of the stream; the texts the
    lobby sent, and the code of its one close frame (None: it sent none)."""
    async with RawClient.connect(lobby) as client:
        client.writer.write(b"".join(frames))
        while await client.read():
            pass
        closes = [
            Close.parse(bytes(f.data)).code for f in client.frames if f.opcode is Opcode.CLOSE
        ]
        assert len(closes) <= 1, closes
        return texts(client.frames), closes[0] if closes else None


def close_frame(code: int) -> bytes:
    """A masked close frame with any code, even one websockets would refuse to build."""
    return Frame(Opcode.CLOSE, struct.pack("!H", code) + b"bye").serialize(mask=True, extensions=[])


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_text_that_is_not_utf8_closes_with_1007(tmp_path: Path, transport: str) -> None:
    register = frame("utf8", "REGISTER", {"description": "café"}).encode()
    at = register.index(CUT) + 1  # between the two bytes of "é"
    async with running(tmp_path, transport=transport) as lobby:
        # Whole: closed, not answered `malformed`, and what followed it is not routed.
        assert await answer_to(
            lobby, masked(Opcode.TEXT, b'{"a": "\xff"}'), masked(Opcode.TEXT, register)
        ) == ([], 1007)
        # Fragmented, the bad byte in the last fragment.
        assert await answer_to(
            lobby,
            masked(Opcode.TEXT, register[:at], fin=False),
            masked(Opcode.CONT, b"\xc3\x28" + register[at + 1 :]),
        ) == ([], 1007)
        # Failed at the fragment that brings the bad byte, before the message ends.
        assert await answer_to(lobby, masked(Opcode.TEXT, b"\xed\xa0\x80", fin=False)) == (
            [],
            1007,
        )
        # A character cut by the fragment boundary is valid once joined: registered.
        async with RawClient.connect(lobby) as client:
            client.writer.write(
                masked(Opcode.TEXT, register[:at], fin=False) + masked(Opcode.CONT, register[at:])
            )
            (ack,) = texts(await client.until(Opcode.TEXT))
            assert b"success_registered_finalized" in ack
        # Binary is not text: not checked (the lobby answers it as it always has).
        async with RawClient.connect(lobby) as client:
            client.writer.write(masked(Opcode.BINARY, b"\xff"))
            (error,) = texts(await client.until(Opcode.TEXT))
            assert b'"ERROR"' in error


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_fragments_out_of_order_close_with_1002(tmp_path: Path, transport: str) -> None:
    discover = frame("raw", "DISCOVER_SERVICES", {}).encode()
    async with running(tmp_path, transport=transport) as lobby:
        # A continuation with nothing to continue.
        assert await answer_to(lobby, masked(Opcode.CONT, discover)) == ([], 1002)
        # A new message in the middle of a fragmented one: neither is routed.
        assert await answer_to(
            lobby,
            masked(Opcode.TEXT, discover[:10], fin=False),
            masked(Opcode.TEXT, discover),
            masked(Opcode.CONT, discover[10:]),
        ) == ([], 1002)


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_close_codes_no_peer_may_send_close_with_1002_and_valid_ones_are_echoed(
    tmp_path: Path, transport: str
) -> None:
    async with running(tmp_path, transport=transport) as lobby:
        for code in INVALID_CLOSE_CODES:
            assert await answer_to(lobby, close_frame(code)) == ([], 1002), code
        for code in VALID_CLOSE_CODES:
            assert await answer_to(lobby, close_frame(code)) == ([], code), code


def test_utf8_checks() -> None:
    assert valid_utf8(b"")
    assert valid_utf8(b'{"ascii": true}')
    assert valid_utf8("κόσμε €𝄞".encode())
    for bad in [b"\xff", b"\xc3\x28", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\xc0\xaf", CUT[:1]]:
        assert not valid_utf8(bad), bad
    stream = Utf8Stream()
    assert stream.feed(b"caf" + CUT[:1], final=False)  # cut: waits for the rest
    assert stream.feed(CUT[1:], final=True)
    assert not Utf8Stream().feed(CUT[:1], final=True)  # never finished
    assert not Utf8Stream().feed(b"\xff", final=False)  # fails at once


def test_close_codes_a_peer_may_send() -> None:
    for code in [1000, 1001, 1002, 1003, 1007, 1008, 1009, 1010, 1011, 1012, 1013, 1014]:
        assert sendable_close_code(code), code
    for code in [*INVALID_CLOSE_CODES, 1100, 2000, 65535]:
        assert not sendable_close_code(code), code
    assert sendable_close_code(3000)
    assert sendable_close_code(4999)


def test_a_lone_close_frame_is_told_from_a_part_of_one_or_one_behind_a_message() -> None:
    close = Frame(Opcode.CLOSE, Close(1001, "").serialize()).serialize(mask=True, extensions=[])
    with_reason = Frame(Opcode.CLOSE, Close(1000, "bye" * 40).serialize())
    text = Frame(Opcode.TEXT, b"{}").serialize(mask=True, extensions=[])
    assert lone_close_frame(close)
    assert lone_close_frame(with_reason.serialize(mask=True, extensions=[]))
    assert not any(lone_close_frame(close[:n]) for n in range(len(close)))  # a read cut short
    assert not lone_close_frame(text + close)
    assert not lone_close_frame(close + text)
    assert not lone_close_frame(text)
