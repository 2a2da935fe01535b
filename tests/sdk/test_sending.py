"""agent_sdk/sending.py against a real lobby: nothing follows an UNREGISTER on the wire, not
even an ACK that was already due (and its task started) when `unregister()` began."""

from __future__ import annotations

from typing import Any

from agent_sdk import Agent, RequestContext, capability
from lobby.server import LobbyServer
from tests.sdklogs import sdk_events


class Echo(Agent):
    agent_id = "echo"

    @capability("echo")
    async def echo(self, request: dict[str, Any], ctx: RequestContext) -> dict[str, Any]:
        return request


async def test_an_ack_due_before_unregister_does_not_follow_it(lobby: LobbyServer) -> None:
    with sdk_events() as events:
        async with Echo(lobby_url=lobby.url) as echo, Agent("caller", lobby_url=lobby.url) as me:
            assert await me.request("echo", "echo", {"n": 1}) == {"n": 1}
            sender = echo._sender
            assert sender.dispatcher.ack_due() is not None  # the REQUEST is done, not ACKed
            timer = sender._ack_timer
            assert timer is not None
            timer.cancel()
            sender._flush_ack()  # the ACK's task is started, not yet run
            await echo.unregister()
    assert not [e for e in events if e["event"] == "LOBBY_ERROR"]
