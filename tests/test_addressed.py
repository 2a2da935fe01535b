"""Capability-addressed REQUESTs against a real lobby on 127.0.0.1: `me.call` spread over two
providers, filters and allow-lists, the lobby's refusals, and failover when the provider's
process is SIGKILLed mid-request (lobby/core/addressed.py, agent_sdk/caller.py)."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import orjson
import pytest
from pydantic import BaseModel
from websockets.asyncio.client import ClientConnection, connect

from agent_sdk import (
    Agent,
    InvalidInputError,
    NoProviderError,
    RequestContext,
    RequestRefusedError,
    capability,
)
from lobby.server import LobbyServer
from tests.wsclient import frame, reply, token_of

ROOT = Path(__file__).resolve().parents[1]


class Quote(BaseModel):
    item: str


class Provider(Agent):
    """Answers `quote` with its own id; says whether the REQUEST came marked redelivered."""

    def __init__(self, agent_id: str, **kwargs: Any) -> None:
        super().__init__(agent_id, **kwargs)
        self.redelivered: list[str] = []

    @capability("quote")
    async def quote(self, request: Quote, ctx: RequestContext) -> dict[str, Any]:
        if ctx.message.redelivered:
            self.redelivered.append(str(ctx.message.message_id))
        return {"item": request.item, "by": self.agent_id}


def declared(name: str = "quote", **extra: Any) -> dict[str, Any]:
    return {"name": name, "description": f"does {name}", **extra}


async def test_calls_spread_over_two_providers_and_the_answer_names_who_answered(
    lobby: LobbyServer,
) -> None:
    async with (
        Provider("p1", lobby_url=lobby.url),
        Provider("p2", lobby_url=lobby.url),
        Agent("caller", lobby_url=lobby.url) as me,
    ):
        answers = [
            await me.call("quote", {"item": f"i{n}"}, timeout=10, with_provider=True)
            for n in range(4)
        ]
        providers = [provider for _, provider in answers]
        assert {providers[0], providers[1]} == {"p1", "p2"}
        assert providers[2:] == providers[:2]  # in turn: each answered before the next
        for n, (result, provider) in enumerate(answers):
            assert result == {"item": f"i{n}", "by": provider}
        only = await me.call("quote", Quote(item="x"), output_type=Quote, timeout=10)
        assert only == Quote(item="x")


async def test_filters_allow_lists_and_no_provider(lobby: LobbyServer) -> None:
    async with (
        connect(lobby.url) as eu,
        connect(lobby.url) as us,
        Agent("caller", lobby_url=lobby.url) as me,
    ):
        eu_token = await token_of(eu, "eu", capabilities=[declared(attributes={"region": "eu"})])
        await token_of(
            us,
            "us",
            capabilities=[
                declared(attributes={"region": "us"}, authorized_requester_ids=["someone"])
            ],
        )
        # Only eu admits the caller: it gets every call, whatever the turn.
        for n in range(2):
            task = asyncio.ensure_future(me.call("quote", {"n": n}, timeout=10))
            got = await reply(eu)
            assert (got["sender_id"], got["payload"]) == (
                "caller",
                {"capability_name": "quote", "n": n},
            )
            await eu.send(
                frame(
                    "eu",
                    "RESPONSE",
                    {"status": "success", "n": n},
                    receiver_id="caller",
                    conversation_id=got["conversation_id"],
                    auth_token=eu_token,
                )
            )
            assert await task == {"n": n}
        us_only = [{"attribute": "region", "value": "us"}]
        with pytest.raises(NoProviderError) as refused:
            await me.call("quote", filters=us_only, timeout=10)
        assert refused.value.message == (
            "no online agent offers capability 'quote' to 'caller' matching the filters"
        )
        with pytest.raises(NoProviderError, match=r"capability 'nothing' to 'caller'$"):
            await me.call("nothing", timeout=10)
        with pytest.raises(RequestRefusedError) as malformed:
            await me.call("quote", filters=[{"attribute": "region", "op": "like", "value": 1}])
        assert malformed.value.code == "malformed"


async def test_arguments_no_provider_accepts_are_refused_as_invalid_input(
    lobby: LobbyServer,
) -> None:
    async with Provider("p1", lobby_url=lobby.url), Agent("caller", lobby_url=lobby.url) as me:
        with pytest.raises(InvalidInputError) as refused:
            await me.call("quote", {"item": 5}, timeout=10)
        assert refused.value.payload["path"] == "/item"
        assert refused.value.message.startswith(
            "Invalid input for capability 'quote' on agent 'p1'"
        )


_STALLING = """
import asyncio, json, os, sys
from websockets.asyncio.client import connect

async def main():
    async with connect(os.environ["LOBBY_URL"]) as ws:
        register = {"capabilities": [{"name": "quote", "description": "stalls"}], "acks": True}
        await ws.send(json.dumps({"sender_id": sys.argv[1], "receiver_id": "global_lobby",
                                  "message_type": "REGISTER", "payload": register}))
        ack = json.loads(await ws.recv())
        print("token", ack["payload"]["auth_token"], flush=True)
        while True:
            message = json.loads(await ws.recv())
            if message["message_type"] == "REQUEST":
                print("request", message["message_id"], message["conversation_id"], flush=True)

asyncio.run(main())
"""


@asynccontextmanager
async def stalling(
    url: str, agent_id: str, tmp_path: Path
) -> AsyncIterator[tuple[asyncio.subprocess.Process, str]]:
    """A provider of `quote` in its own process that takes REQUESTs and never answers; yields
    the process and its token once it is registered."""
    script = tmp_path / "stalling.py"
    script.write_text(_STALLING)
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        str(script),
        agent_id,
        env={**os.environ, "LOBBY_URL": url, "PYTHONPATH": str(ROOT)},
        stdout=asyncio.subprocess.PIPE,
    )
    try:
        assert process.stdout is not None
        line = await asyncio.wait_for(process.stdout.readline(), 30)
        assert line.startswith(b"token ")
        yield process, line.split()[1].decode()
    finally:
        if process.returncode is None:
            process.kill()
        await process.wait()


async def took_request(process: asyncio.subprocess.Process) -> tuple[str, str]:
    """Once the stalling provider has a REQUEST: its message_id and conversation_id."""
    assert process.stdout is not None
    line = await asyncio.wait_for(process.stdout.readline(), 30)
    assert line.startswith(b"request ")
    _, message_id, conversation_id = line.decode().split()
    return message_id, conversation_id


async def late_response(url: str, agent_id: str, token: str, conversation_id: str) -> Any:
    """`agent_id` resumes and answers the REQUEST it had: the lobby's answer to that."""
    async with connect(url) as ws:
        ack = await _register(ws, agent_id, token)
        assert ack["payload"]["status"] == "success_resumed", ack
        await ws.send(
            frame(
                agent_id,
                "RESPONSE",
                {"status": "success"},
                receiver_id="caller",
                conversation_id=conversation_id,
                auth_token=token,
            )
        )
        while True:
            answer = await reply(ws)
            if answer["message_type"] == "ERROR":
                return answer["payload"]


async def _register(ws: ClientConnection, agent_id: str, token: str) -> dict[str, Any]:
    await ws.send(frame(agent_id, "REGISTER", {}, auth_token=token))
    return orjson.loads(await ws.recv())  # type: ignore[no-any-return]


async def test_a_provider_killed_mid_request_fails_over_to_another(
    lobby: LobbyServer, tmp_path: Path
) -> None:
    # Registered first, both serving nothing: the stalling provider has the first turn.
    async with (
        stalling(lobby.url, "stalls", tmp_path) as (process, token),
        Provider("steady", lobby_url=lobby.url) as steady,
        Agent("caller", lobby_url=lobby.url) as me,
    ):
        call = asyncio.ensure_future(
            me.call("quote", {"item": "x"}, timeout=20, with_provider=True)
        )
        message_id, conversation_id = await took_request(process)
        process.send_signal(signal.SIGKILL)
        result, provider = await call
        assert (result, provider) == ({"item": "x", "by": "steady"}, "steady")
        assert steady.redelivered == [message_id]  # the same REQUEST, marked redelivered
        refused = await late_response(lobby.url, "stalls", token, conversation_id)
        assert refused["code"] == "unknown_conversation"


async def test_a_sole_provider_killed_mid_request_fails_over_to_one_that_came_after(
    lobby: LobbyServer, tmp_path: Path
) -> None:
    # The only provider when the call is made (the lobby keeps the frame it gave it); another
    # offers the capability only then, and gets the same REQUEST (its arguments read back).
    async with (
        stalling(lobby.url, "stalls", tmp_path) as (process, _),
        Agent("caller", lobby_url=lobby.url) as me,
    ):
        # No deadline: a REQUEST with one is kept whole (`Addressed`) from the start.
        call = asyncio.ensure_future(me.call("quote", {"item": "x"}, with_provider=True))
        message_id, _ = await took_request(process)
        kept = [
            v for k, v in lobby.router.addressed.pending.items() if k[:2] == ("caller", "stalls")
        ]
        assert [type(v) for v in kept] == [tuple]  # what failover needs: the frame given
        async with Provider("steady", lobby_url=lobby.url) as steady:
            process.send_signal(signal.SIGKILL)
            result, provider = await asyncio.wait_for(call, 20)
        assert (result, provider) == ({"item": "x", "by": "steady"}, "steady")
        assert steady.redelivered == [message_id]


async def test_the_last_provider_killed_is_answered_no_provider(
    lobby: LobbyServer, tmp_path: Path
) -> None:
    async with (
        stalling(lobby.url, "stalls", tmp_path) as (process, _),
        Agent("caller", lobby_url=lobby.url) as me,
    ):
        call = asyncio.ensure_future(me.call("quote", {"item": "x"}, timeout=20))
        await took_request(process)
        process.send_signal(signal.SIGKILL)
        with pytest.raises(NoProviderError) as refused:
            await call
        assert refused.value.message == "no online agent offers capability 'quote' to 'caller'"
        assert lobby.router.conversations == {}
