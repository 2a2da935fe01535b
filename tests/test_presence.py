"""Presence over real sockets (PROTOCOL.md §4.1): WATCH's snapshot and every change at once on
the wire, the SDK's `watch()` as an iterator and as a callback, watches sent again after the
lobby restarts, and a watcher that does not read holding up nobody."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import pytest
import websockets.asyncio.client

from agent_sdk import Agent, LobbyError, PresenceChange, PresenceEvent, RequestContext, capability
from lobby.server import LobbyServer
from tests.conftest import make_lobby, start_lobby_process
from tests.waiting import until
from tests.wsclient import frame, reply, token_of


class Quoter(Agent):
    @capability("quote", description="Quotes a price.")
    async def quote(self, request: dict[str, Any], ctx: RequestContext) -> dict[str, Any]:
        return {"price": 1}


def event(message: dict[str, Any]) -> tuple[str, Any, Any, Any]:
    assert message["message_type"] == "PRESENCE", message
    payload = message["payload"]
    return (
        payload["event"],
        payload.get("agent_id"),
        payload.get("online"),
        payload.get("capabilities", payload.get("count")),
    )


async def test_watch_on_the_wire_snapshot_then_each_change(lobby: LobbyServer) -> None:
    quote = [{"name": "quote"}]
    async with (
        websockets.asyncio.client.connect(lobby.url) as w,
        websockets.asyncio.client.connect(lobby.url) as b,
    ):
        token_w = await token_of(w, "w")
        token_b = await token_of(b, "b", capabilities=[*quote, {"name": "rate"}])
        await w.send(
            frame(
                "w", "WATCH", {"capability_name": "quote"}, auth_token=token_w, conversation_id="q"
            )
        )
        assert event(await reply(w)) == ("snapshot", "b", True, ["quote", "rate"])
        assert event(await reply(w)) == ("snapshot_end", None, None, 1)
        async with websockets.asyncio.client.connect(lobby.url) as c:
            token_c = await token_of(c, "c", capabilities=quote)
            assert event(await reply(w)) == ("online", "c", True, ["quote"])
            changed = {"capabilities": [{"name": "quote", "description": "cheaper"}]}
            await c.send(frame("c", "UPDATE_CAPABILITIES", changed, auth_token=token_c))
            assert event(await reply(w)) == ("capabilities_changed", "c", True, ["quote"])
        assert event(await reply(w)) == ("offline", "c", False, ["quote"])
        async with websockets.asyncio.client.connect(lobby.url) as c:
            await c.send(frame("c", "REGISTER", {}, auth_token=token_c))
            assert (await reply(c))["payload"]["status"] == "success_resumed"
            assert event(await reply(w)) == ("online", "c", True, ["quote"])
            await c.send(frame("c", "UNREGISTER", {}, auth_token=token_c))
            assert event(await reply(w)) == ("removed", "c", False, [])
        await w.send(frame("w", "UNWATCH", {}, auth_token=token_w, conversation_id="q"))
        await b.send(frame("b", "UPDATE_CAPABILITIES", {"capabilities": quote}, auth_token=token_b))
        await w.send(frame("w", "UNWATCH", {}, auth_token=token_w, conversation_id="q"))
        # The update after UNWATCH told w nothing: the next frame is the second UNWATCH's ERROR.
        error = await reply(w)
        assert error["message_type"] == "ERROR"
        assert error["payload"]["code"] == "unknown_conversation"


async def test_the_sdk_watch_iterates_and_calls_back(lobby: LobbyServer) -> None:
    called: list[PresenceChange] = []
    async with (
        Quoter("b", lobby_url=lobby.url),
        Agent("me", lobby_url=lobby.url) as me,
    ):
        by_id = me.watch(agent_ids=["c", "b"], on_change=called.append)
        async with me.watch("quote") as watch:
            changes = aiter(watch)
            first = await anext(changes)
            assert first == PresenceChange("b", PresenceEvent.SNAPSHOT, True, ("quote",))
            await watch.synced(5)
            assert watch.online() == ["b"]
            async with Quoter("c", lobby_url=lobby.url):
                assert await anext(changes) == PresenceChange(
                    "c", PresenceEvent.ONLINE, True, ("quote",)
                )
                assert watch.online() == ["b", "c"]
            assert await anext(changes) == PresenceChange(
                "c", PresenceEvent.OFFLINE, False, ("quote",)
            )
            assert watch.online() == ["b"]
        await until(lambda: len(called) == 3)
        assert [(c.agent_id, c.event) for c in called] == [
            ("b", PresenceEvent.SNAPSHOT),
            ("c", PresenceEvent.ONLINE),
            ("c", PresenceEvent.OFFLINE),
        ]
        await by_id.close()
        await until(lambda: lobby.router.state.presence.of_session == {})


async def test_a_refused_watch_raises_from_the_iteration(lobby: LobbyServer) -> None:
    async with Agent("me", lobby_url=lobby.url) as me:
        watches = [me.watch(f"c{n}") for n in range(16)]
        for watch in watches:
            await watch.synced(5)
        seventeenth = me.watch("one-too-many")
        with pytest.raises(LobbyError, match=r"^limit_exceeded: agent 'me' already holds 16"):
            await anext(aiter(seventeenth))
        await watches[0].close()
        async with me.watch("now-fits") as fits:
            await fits.synced(5)


async def test_watches_are_sent_again_after_the_lobby_restarts(tmp_path: Path) -> None:
    first = start_lobby_process(tmp_path)
    second = None
    try:
        async with Agent("me", lobby_url=first.url, reconnect_max_delay=0.5) as me:
            watch = me.watch(agent_ids=["b"])
            await watch.synced(5)
            assert watch.agents == {}
            first.signal(signal.SIGKILL)
            first.wait(5)
            second = start_lobby_process(tmp_path, port=first.port)
            await until(lambda: me.stats.connects == 2, "the watcher back")
            await watch.synced(5)  # the watch sent again, and its new snapshot
            async with Quoter("b", lobby_url=second.url) as b:
                await until(lambda: watch.online() == ["b"], "b online, seen by the new watch")
                await b.unregister()
            await until(lambda: "b" not in watch.agents, "b removed")
            seen: list[PresenceEvent] = []
            while len(seen) < 2:
                seen.append((await anext(aiter(watch))).event)
            assert seen == [PresenceEvent.ONLINE, PresenceEvent.REMOVED]
    finally:
        for process in (first, second):
            if process is not None and process.process.poll() is None:
                process.signal(signal.SIGTERM)
                process.wait(10)


async def test_a_watcher_that_does_not_read_holds_up_nobody(tmp_path: Path) -> None:
    """Every change of b sends its 16 watches a PRESENCE of ~40 KB; the watcher reads none.
    b's updates and the answers it waits for go on; the watcher's connection is cut (4002)."""
    lobby = make_lobby(tmp_path / "data", max_outbound_bytes=256 * 1024, shutdown_timeout=1.0)
    await lobby.start()
    names = [{"name": f"quote-{'x' * 200}-{n}"} for n in range(200)]
    try:
        async with (
            websockets.asyncio.client.connect(lobby.url, max_queue=1, close_timeout=0.1) as w,
            websockets.asyncio.client.connect(lobby.url, max_size=None) as b,
        ):
            token_w = await token_of(w, "w")
            token_b = await token_of(b, "b", capabilities=[{"name": "quote"}])
            for n in range(16):
                watch = {"capability_name": "quote"}
                await w.send(frame("w", "WATCH", watch, auth_token=token_w, conversation_id=f"{n}"))
            await until(
                lambda: len(lobby.router.state.presence.by_capability.get("quote", ())) == 16
            )
            for turn in range(40):
                offered = [{"name": "quote"}, *names[: 100 + turn % 2]]
                await b.send(
                    frame("b", "UPDATE_CAPABILITIES", {"capabilities": offered}, auth_token=token_b)
                )
                await b.send(frame("b", "LIST_TRANSACTIONS", {}, auth_token=token_b))
                assert (await reply(b))["message_type"] == "TRANSACTIONS"
            await until(lambda: lobby.router.state.presence.of_session == {}, "w cut off")
            assert lobby.router.registry.agents["w"].session is None
    finally:
        await lobby.stop()
