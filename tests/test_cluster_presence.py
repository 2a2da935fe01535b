"""Presence across lobby nodes (lobby/cluster/presence.py): a watcher homed on node b hears of
the agents homed on node a, those connected before b started included, as they come, change
and go, and when node a dies. Real `lobby serve --cluster` processes on a real `nats-server -js`,
raw WebSocket."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import websockets.asyncio.client

from tests.conftest import LobbyProcess
from tests.natskit import nats_server
from tests.routerkit import cap
from tests.test_cluster_node import node
from tests.test_cluster_registry import WAIT, agent
from tests.test_durability import stop
from tests.wsclient import frame, reply


async def presence_until(
    ws: websockets.asyncio.client.ClientConnection, wanted: Callable[[dict[str, Any]], bool]
) -> dict[str, Any]:
    """The first PRESENCE payload `ws` receives that is `wanted` (others are passed over: the
    order of a node's report and a registration change of another is not fixed)."""
    async with asyncio.timeout(WAIT):
        while True:
            message = await reply(ws)
            if message["message_type"] == "PRESENCE" and wanted(message["payload"]):
                payload: dict[str, Any] = message["payload"]
                return payload


def about(agent_id: str, event: str, online: bool) -> Callable[[dict[str, Any]], bool]:
    return lambda p: (p.get("agent_id"), p["event"], p.get("online")) == (agent_id, event, online)


async def test_a_watcher_on_one_node_hears_of_the_agents_of_another(tmp_path: Path) -> None:
    async with nats_server(tmp_path) as nats:
        a = node(tmp_path / "a", nats, "a")
        b: LobbyProcess | None = None
        try:
            async with agent(a, "early", capabilities=[cap("quote")]):
                b = node(tmp_path / "b", nats, "b")  # started after early connected to a
                async with agent(b, "watcher") as watcher:
                    watch = frame(
                        "watcher",
                        "WATCH",
                        {"capability_name": "quote"},
                        auth_token=watcher.token,
                        conversation_id="q",
                    )
                    await watcher.ws.send(watch)
                    # b learns of early from the registry, and that it is online from a's
                    # answer to b's hello: in the snapshot, or as a change right after it.
                    await presence_until(
                        watcher.ws,
                        lambda p: p.get("agent_id") == "early" and p.get("online") is True,
                    )
                    async with agent(a, "seller", capabilities=[cap("quote")]) as seller:
                        got = await presence_until(watcher.ws, about("seller", "online", True))
                        assert got["capabilities"] == ["quote"]
                        update = {"capabilities": [cap("quote"), cap("sell")]}
                        await seller.ws.send(
                            frame("seller", "UPDATE_CAPABILITIES", update, auth_token=seller.token)
                        )
                        got = await presence_until(
                            watcher.ws, about("seller", "capabilities_changed", True)
                        )
                        assert got["capabilities"] == ["quote", "sell"]
                    await presence_until(watcher.ws, about("seller", "offline", False))
                    async with websockets.asyncio.client.connect(a.url) as again:
                        await again.send(frame("seller", "REGISTER", {}, auth_token=seller.token))
                        assert (await reply(again))["payload"]["status"] == "success_resumed"
                        await presence_until(watcher.ws, about("seller", "online", True))
                        await again.send(frame("seller", "UNREGISTER", {}, auth_token=seller.token))
                        got = await presence_until(watcher.ws, about("seller", "removed", False))
                        assert got["capabilities"] == []
                    # Node a is killed: out of b's view of the live nodes, its agents are offline.
                    a.signal(signal.SIGKILL)
                    a.wait(10)
                    await presence_until(watcher.ws, about("early", "offline", False))
        finally:
            stop(a)
            if b is not None:
                stop(b)
