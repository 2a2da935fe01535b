"""Hostile input: ids and names over their length limits.

Synchronously for the codec's checks, and over real sockets on both transports.
"""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from websockets.asyncio.client import ClientConnection, connect

from lobby.server import LobbyServer
from protocol import MAX_AGENT_ID_LENGTH, MAX_ID_LENGTH, MAX_NAME_LENGTH, DecodeError, decode
from tests.wsclient import frame, register, reply


def capability(name: str, **fields: Any) -> dict[str, Any]:
    return {"name": name, "description": "", "input_schema": {}, "output_schema": {}, **fields}


async def join(ws: ClientConnection, agent_id: str, **payload: Any) -> str:
    ack = await register(ws, agent_id, **payload)
    assert ack["message_type"] == "REGISTER_ACK", ack
    token: str = ack["payload"]["auth_token"]
    return token


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
        (capability("c", attributes={"a" * (MAX_NAME_LENGTH + 1): 1}), "[key]", MAX_NAME_LENGTH),
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
