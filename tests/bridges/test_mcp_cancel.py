"""Deadlines and cancellation across the MCP bridges, with the `mcp` SDK's own client and
server in process (its memory transport) and a real lobby: an MCP client's
`notifications/cancelled` cancels the REQUEST of `lobby mcp`'s tool call; a call to an agent
gone offline since the last reading ends at its deadline, its REQUEST dropped; and
`lobby bridge mcp` passes the lobby's CANCEL and a deadline on to its MCP server."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import mcp.types as types
import pytest
from mcp import McpError
from mcp.server.fastmcp import FastMCP
from mcp.shared.memory import create_connected_server_and_client_session

from agent_sdk import Agent, RemoteTimeoutError, RequestCancelled
from bridges.mcp import LobbyTools, Sessions, mcp_server
from bridges.mcp_agent import McpToolAgent, list_tools
from lobby.server import LobbyServer
from tests.conftest import make_lobby
from tests.sdklogs import sdk_events
from tests.test_deadlines import Worker


@pytest.fixture
async def lobby(tmp_path: Path) -> AsyncIterator[LobbyServer]:
    server = make_lobby(tmp_path / "lobby-data")
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


async def test_an_mcp_clients_cancel_cancels_the_request(lobby: LobbyServer) -> None:
    async with Worker(lobby_url=lobby.url) as worker, Agent("mcp_user", lobby_url=lobby.url) as me:
        tools = LobbyTools(me)
        await tools.refresh()
        async with create_connected_server_and_client_session(
            mcp_server(tools, Sessions())
        ) as client:
            with sdk_events() as events:
                request_id = client._request_id  # the id call_tool gives its request
                call = asyncio.create_task(client.call_tool("worker.work", {}))
                await asyncio.wait_for(worker.started.wait(), 10)
                params = types.CancelledNotificationParams(requestId=request_id, reason="bored")
                await client.send_notification(
                    types.ClientNotification(types.CancelledNotification(params=params))
                )
                await asyncio.wait_for(worker.stopped.wait(), 10)
                with pytest.raises(McpError):
                    await asyncio.wait_for(call, 10)  # "Request cancelled"
        assert worker.contexts[0].cancelled.is_set()
        (cancelled,) = [e for e in events if e["event"] == "REQUEST_CANCELLED"]
        assert cancelled["reason"] == "the requester stopped waiting"
        assert lobby.router.conversations == {}


async def test_a_call_to_an_agent_gone_offline_ends_at_its_deadline(lobby: LobbyServer) -> None:
    async with Agent("mcp_user", lobby_url=lobby.url) as me:
        tools = LobbyTools(me, call_timeout=0.3)
        async with Worker(lobby_url=lobby.url):
            await tools.refresh()
        # Offline now, though the last reading listed it: the REQUEST is held for it.
        started = time.monotonic()
        result = await tools.call("worker.work", {})
        assert time.monotonic() - started < 5
        assert result.isError
        text = result.content[0]
        assert isinstance(text, types.TextContent)
        assert text.text.startswith("timeout: no final RESPONSE to REQUEST ")
        assert text.text.endswith(" within 300 ms")
        assert list(lobby.router.registry.agents["worker"].mailbox) == []  # dropped


def waiting_server() -> tuple[FastMCP, asyncio.Event, asyncio.Event]:
    """An MCP server whose tool `wait` never finishes: (server, started, cancelled)."""
    server = FastMCP("waiter", log_level="WARNING")
    started, cancelled = asyncio.Event(), asyncio.Event()

    @server.tool()
    async def wait() -> str:
        """Waits until cancelled."""
        started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return "never"  # pragma: no cover

    return server, started, cancelled


@pytest.mark.parametrize("ending", ["cancel", "deadline"])
async def test_the_bridge_passes_cancel_and_deadlines_to_its_mcp_server(
    lobby: LobbyServer, ending: str
) -> None:
    server, started, cancelled = waiting_server()
    async with create_connected_server_and_client_session(server) as session:
        agent = McpToolAgent("waiter", session, await list_tools(session), lobby_url=lobby.url)
        async with agent, Agent("caller", lobby_url=lobby.url) as me:
            if ending == "cancel":
                call = asyncio.create_task(me.request("waiter", "wait", {}, conversation_id="c"))
                await asyncio.wait_for(started.wait(), 10)
                await me.cancel("c")
                with pytest.raises(RequestCancelled):
                    await asyncio.wait_for(call, 10)
            else:
                with pytest.raises(RemoteTimeoutError):
                    await me.request("waiter", "wait", {}, timeout=0.3)
            await asyncio.wait_for(cancelled.wait(), 10)
