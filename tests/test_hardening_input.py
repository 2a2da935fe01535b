"""Hostile input: ids and names over their length limits, and strings from frames quoted only
clipped, so that no frame can flood the lobby's log or come back amplified in its ERROR.

Over real sockets on both transports, and against `lobby serve` in a child process for the log.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest
import websocket
from websockets.asyncio.client import ClientConnection, connect

from lobby.server import LobbyServer
from protocol import MAX_AGENT_ID_LENGTH, MAX_ID_LENGTH, MAX_NAME_LENGTH, DecodeError, decode
from protocol.fipa import Dialogue, IllegalMove
from protocol.limits import CLIP_LENGTH, MAX_SENTENCE_LENGTH, clip
from protocol.market import InvalidPayment, check_payment
from tests.conftest import TRANSPORTS, LobbyProcess
from tests.wsclient import frame, register, reply, running

HUGE = 250_000
"""Characters of a hostile string: as much as fits in a default 256 KiB frame."""


def capability(name: str, **fields: Any) -> dict[str, Any]:
    return {"name": name, "description": "", "input_schema": {}, "output_schema": {}, **fields}


async def join(ws: ClientConnection, agent_id: str, **payload: Any) -> str:
    ack = await register(ws, agent_id, **payload)
    assert ack["message_type"] == "REGISTER_ACK", ack
    token: str = ack["payload"]["auth_token"]
    return token


# -- clip ------------------------------------------------------------------------------------


def test_clip_keeps_short_text_and_says_how_much_it_cut() -> None:
    assert clip("x" * CLIP_LENGTH) == "x" * CLIP_LENGTH
    assert clip("x" * 1000) == "x" * CLIP_LENGTH + f"...(+{1000 - CLIP_LENGTH} characters)"
    assert clip("abcdef", 2) == "ab...(+4 characters)"


# -- the codec's checks, synchronously --------------------------------------------------------

LIMITS = [
    ("sender_id", MAX_AGENT_ID_LENGTH),
    ("receiver_id", MAX_AGENT_ID_LENGTH),
    ("conversation_id", MAX_ID_LENGTH),
    ("message_id", MAX_ID_LENGTH),
    ("in_reply_to", MAX_ID_LENGTH),
    ("auth_token", MAX_ID_LENGTH),
]


def envelope(**fields: Any) -> dict[str, Any]:
    return {
        "sender_id": "a",
        "receiver_id": "b",
        "message_type": "REQUEST",
        "payload": {"capability_name": "c"},
        "conversation_id": "k",
        **fields,
    }


@pytest.mark.parametrize(("field", "limit"), LIMITS)
def test_decode_takes_an_id_at_its_limit_and_refuses_one_past_it(field: str, limit: int) -> None:
    at_limit = decode(orjson.dumps(envelope(**{field: "i" * limit})))
    assert getattr(at_limit, field) == "i" * limit
    with pytest.raises(DecodeError) as refused:
        decode(orjson.dumps(envelope(**{field: "i" * (limit + 1)})))
    assert str(refused.value) == (
        f"field {field!r} has {limit + 1} characters; at most {limit} are allowed"
    )


def test_a_decode_error_echoes_what_it_read_clipped() -> None:
    with pytest.raises(DecodeError) as refused:
        decode(orjson.dumps(envelope(message_type="X" * HUGE, conversation_id="c" * HUGE)))
    error = refused.value
    assert error.reason == f"unknown message_type {clip('X' * HUGE)!r}"
    assert error.message_type == clip("X" * HUGE)
    assert error.conversation_id is None  # not a valid id: left out, not echoed
    # A valid conversation id comes back whole, so the agent can still match the ERROR.
    with pytest.raises(DecodeError) as refused:
        decode(orjson.dumps(envelope(payload=[], conversation_id="c" * MAX_ID_LENGTH)))
    assert refused.value.conversation_id == "c" * MAX_ID_LENGTH


# -- ids over their limit, over real sockets --------------------------------------------------


@pytest.mark.parametrize(("field", "limit"), LIMITS)
async def test_an_id_over_its_limit_is_refused_and_the_lobby_serves_on(
    lobby: LobbyServer, field: str, limit: int
) -> None:
    async with connect(lobby.url) as alice, connect(lobby.url) as bob:
        token = await join(alice, "alice")
        await join(bob, "bob", capabilities=[capability("echo")])

        def request(**fields: Any) -> str:
            body = {
                "sender_id": "alice",
                "receiver_id": "bob",
                "message_type": "REQUEST",
                "payload": {"capability_name": "echo"},
                "conversation_id": "k1",
                "auth_token": token,
                **fields,
            }
            return orjson.dumps(body).decode()

        await alice.send(request(**{field: "x" * (limit + 1)}))
        error = await reply(alice)
        assert error["message_type"] == "ERROR"
        assert error["payload"]["code"] == "malformed"
        assert error["payload"]["error"] == (
            f"field {field!r} has {limit + 1} characters; at most {limit} are allowed"
        )
        # Nothing reached bob; alice's connection and the lobby serve on.
        await alice.send(request(message_id="m-ok"))
        delivered = await reply(bob)
        assert (delivered["message_id"], delivered["sender_id"]) == ("m-ok", "alice")


async def test_a_register_with_an_overlong_agent_id_is_refused(lobby: LobbyServer) -> None:
    async with connect(lobby.url) as ws:
        error = await register(ws, "a" * (MAX_AGENT_ID_LENGTH + 1))
        assert error["payload"]["code"] == "malformed"
        assert f"at most {MAX_AGENT_ID_LENGTH}" in error["payload"]["error"]
        await join(ws, "a" * MAX_AGENT_ID_LENGTH)


@pytest.mark.parametrize(
    ("overlong", "where", "limit"),
    [
        (capability("n" * (MAX_NAME_LENGTH + 1)), "capabilities.0.name", MAX_NAME_LENGTH),
        (capability("c", keywords=["k" * (MAX_NAME_LENGTH + 1)]), "keywords.0", MAX_NAME_LENGTH),
        # The key is quoted in the sentence (as where the problem is): clipped.
        (capability("c", attributes={"a" * HUGE: 1}), f"{clip('a' * HUGE)}.[key]", MAX_NAME_LENGTH),
        (
            capability("c", authorized_requester_ids=["r" * (MAX_AGENT_ID_LENGTH + 1)]),
            "authorized_requester_ids.0",
            MAX_AGENT_ID_LENGTH,
        ),
    ],
)
async def test_capability_names_over_their_limit_are_refused(
    lobby: LobbyServer, overlong: dict[str, Any], where: str, limit: int
) -> None:
    """At REGISTER and at UPDATE_CAPABILITIES, which then changes nothing."""
    async with connect(lobby.url) as ws, connect(lobby.url) as finder:
        refused = await register(ws, "offerer", capabilities=[overlong])
        assert refused["payload"]["code"] == "malformed"
        assert where in refused["payload"]["error"]
        assert f"at most {limit} characters" in refused["payload"]["error"]
        assert len(refused["payload"]["error"]) < MAX_SENTENCE_LENGTH
        token = await join(ws, "offerer", capabilities=[capability("kept")])
        update = {"capabilities": [overlong]}
        await ws.send(frame("offerer", "UPDATE_CAPABILITIES", update, auth_token=token))
        error = await reply(ws)
        assert error["payload"]["code"] == "malformed"
        assert error["payload"]["original_message_type"] == "UPDATE_CAPABILITIES"
        assert f"at most {limit} characters" in error["payload"]["error"]
        finder_token = await join(finder, "finder")
        await finder.send(frame("finder", "DISCOVER_SERVICES", {}, auth_token=finder_token))
        (service,) = (await reply(finder))["payload"]["services_found"]
        assert [c["name"] for c in service["relevant_capabilities"]] == ["kept"]


# -- what comes back is small -----------------------------------------------------------------


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_the_error_for_a_huge_unknown_message_type_is_small(
    tmp_path: Path, transport: str
) -> None:
    huge_type = "X" * (256 * 1024)
    async with (
        running(tmp_path, transport=transport, max_message_bytes=1024 * 1024) as lobby,
        connect(lobby.url, max_size=None) as ws,
    ):
        await ws.send(frame("a", huge_type, {}, conversation_id="c" * HUGE))
        raw = await ws.recv()
        assert len(raw) < 1500
        error = orjson.loads(raw)
        payload = error["payload"]
        assert payload["code"] == "malformed"
        assert payload["error"] == f"unknown message_type {clip(huge_type)!r}"
        assert payload["original_message_type"] == clip(huge_type)
        # Too long to be a valid id: left out rather than echoed in a form no schema allows.
        assert payload["original_conversation_id"] is None
        assert "conversation_id" not in error
        await join(ws, "still_served")


async def test_a_huge_capability_name_in_a_request_is_quoted_clipped(lobby: LobbyServer) -> None:
    async with connect(lobby.url) as alice, connect(lobby.url) as bob:
        token = await join(alice, "alice")
        await join(bob, "bob", capabilities=[capability("echo")])
        name = "n" * HUGE
        await alice.send(
            frame(
                "alice",
                "REQUEST",
                {"capability_name": name},
                receiver_id="bob",
                conversation_id="k1",
                auth_token=token,
            )
        )
        raw = await alice.recv()
        assert len(raw) < 1024
        response = orjson.loads(raw)
        assert response["payload"]["code"] == "capability_not_found"
        assert response["payload"]["error"] == (
            f"Capability '{clip(name)}' not found on agent 'bob'."
        )


async def test_a_refusal_sentence_built_elsewhere_is_bounded_too(lobby: LobbyServer) -> None:
    """DISCOVER_SERVICES filters quote what they refuse; the ERROR's sentence is clipped whole."""
    async with connect(lobby.url) as ws:
        token = await join(ws, "finder")
        bad = {"attribute": "price", "op": "eq", "value": 1, "z" * HUGE: 1}
        await ws.send(frame("finder", "DISCOVER_SERVICES", {"filters": [bad]}, auth_token=token))
        raw = await ws.recv()
        assert len(raw) < 2 * MAX_SENTENCE_LENGTH
        assert orjson.loads(raw)["payload"]["code"] == "malformed"


def test_payment_and_dialogue_refusals_quote_payload_strings_clipped() -> None:
    with pytest.raises(InvalidPayment) as refused:
        check_payment(
            {"amount": 1, "proposal_message_id": "p" * HUGE},
            payer_id="alice",
            payee_id="bob",
            proposal=None,
            now=0.0,
        )
    assert f"no order proposal {clip('p' * HUGE)!r} is known" in str(refused.value)
    dialogue = Dialogue.start("k", "alice", "bob", "m1", "CFP", None, {"query": {}}, 0.0)
    with pytest.raises(IllegalMove) as illegal:
        dialogue.check("bob", "alice", "PROPOSE", "r" * MAX_ID_LENGTH, {"proposal": {}})
    assert f"not {clip('r' * MAX_ID_LENGTH)!r}" in str(illegal.value)


# -- the log, as `lobby serve` writes it -----------------------------------------------------


def exchange(ws: websocket.WebSocket, text: str) -> dict[str, Any]:
    """Send one frame, return the lobby's answer."""
    ws.send(text)
    answer: dict[str, Any] = orjson.loads(ws.recv())
    return answer


def test_hostile_ids_do_not_flood_the_log(lobby_process: LobbyProcess) -> None:
    """The reproduction: 20 frames with a 250 KB sender_id (AUTHENTICATION_FAILED) and 20 with a
    250 KB conversation_id on a REQUEST its requester may not make (REQUEST_DENIED_AUTHORIZATION)
    each wrote 5 MB of log. The log may grow by a little per frame, never by the frame."""
    proc = lobby_process
    alice = websocket.create_connection(proc.url, timeout=5)
    bob = websocket.create_connection(proc.url, timeout=5)
    try:
        token = exchange(alice, frame("alice", "REGISTER", {}))["payload"]["auth_token"]
        # Names as long as allowed, and many of them: what is logged of them is clipped too.
        names = ["secret"] + [f"{i:03}" + "s" * (MAX_NAME_LENGTH - 3) for i in range(20)]
        offered = [capability(name, authorized_requester_ids=["carol"]) for name in names]
        exchange(bob, frame("bob", "REGISTER", {"capabilities": offered}))

        def request(conversation_id: str, name: str = "secret", sender: str = "alice") -> str:
            return frame(
                sender,
                "REQUEST",
                {"capability_name": name},
                receiver_id="bob",
                conversation_id=conversation_id,
                auth_token=token,
            )

        # A denied REQUEST with ordinary ids is logged: the log is live.
        assert exchange(alice, request("k0"))["payload"]["code"] == "unauthorized"
        before = proc.log_path.stat().st_size
        codes = set()
        for i in range(20):
            forged = request(f"k{i}", sender=f"{i}" + "m" * HUGE)
            codes.add(exchange(alice, forged)["payload"]["code"])
            codes.add(exchange(alice, request(f"{i}" + "c" * HUGE))["payload"]["code"])
        long_ids = request("c" * MAX_ID_LENGTH, names[1])
        assert exchange(alice, long_ids)["payload"]["code"] == "unauthorized"
        # Every frame was answered, so every log line it caused is written (one write each).
        grown = proc.log_path.stat().st_size - before
        assert grown < 40 * 1024, f"40 hostile frames wrote {grown} bytes of log"
        assert codes == {"malformed"}
        events = proc.events()
        (registered,) = [
            e for e in events if e["event"] == "AGENT_REGISTERED" and e["agent_id"] == "bob"
        ]
        assert registered["capabilities"] == clip(", ".join(sorted(names)), MAX_SENTENCE_LENGTH)
        denied = [e for e in events if e["event"] == "REQUEST_DENIED_AUTHORIZATION"]
        assert [(e["capability"], e["conversation_id"]) for e in denied] == [
            ("secret", "k0"),
            (clip(names[1]), clip("c" * MAX_ID_LENGTH)),
        ]
    finally:
        alice.close()
        bob.close()
