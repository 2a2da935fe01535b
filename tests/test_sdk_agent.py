"""agent_sdk.Agent against a real lobby on 127.0.0.1: capabilities, calls, errors, callbacks."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import orjson
import pytest
from pydantic import BaseModel
from websockets.asyncio.client import connect
from websockets.asyncio.server import ServerConnection

from agent_sdk import (
    Agent,
    AgentIdTakenError,
    CapabilityError,
    CapabilityNotFoundError,
    InvalidInputError,
    Message,
    MessageType,
    RegistrationError,
    RemoteError,
    RequestContext,
    RequestTimeoutError,
    Status,
    UnauthorizedError,
    UnknownReceiverError,
    capability,
)
from lobby.server import LobbyServer
from tests.waiting import BOUND, until
from tests.wsclient import register, running


class PriceQuery(BaseModel):
    item: str
    max_price: float | None = None


class PriceResult(BaseModel):
    item: str
    price: float
    source: str


class PriceHunter(Agent):
    agent_id = "price_hunter"

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.calls = 0
        self.sleeping = 0

    @capability(
        "find_cheapest_item_price_v2",
        keywords=["price", "shopping"],
        authorized=["search_agent"],
    )
    async def find_cheapest(self, request: PriceQuery, ctx: RequestContext) -> PriceResult:
        """Finds the cheapest price for an item."""
        self.calls += 1
        await ctx.progress({"searched": 1})
        await ctx.progress({"searched": 2})
        return PriceResult(item=request.item, price=108.8, source=ctx.requester_id)

    @capability("fail_with_code")
    async def fail_with_code(self, request: dict[str, Any], ctx: RequestContext) -> None:
        raise CapabilityError("out of stock", code="out_of_stock")

    @capability("crash")
    async def crash(self, request: dict[str, Any], ctx: RequestContext) -> None:
        raise RuntimeError("secret internal detail")

    @capability("sleep")
    async def sleep(self, request: dict[str, Any], ctx: RequestContext) -> dict[str, Any]:
        self.sleeping += 1
        await asyncio.sleep(float(request.get("seconds", 10)))
        return {"slept": True}


async def test_capability_is_announced_with_schemas_from_its_types(lobby: LobbyServer) -> None:
    async with PriceHunter(lobby_url=lobby.url), Agent("search_agent", lobby_url=lobby.url) as me:
        services = await me.discover("find_cheapest_item_price_v2")
        assert [s.agent_id for s in services] == ["price_hunter"]
        (cap,) = services[0].relevant_capabilities
        assert cap.description == "Finds the cheapest price for an item."
        assert cap.input_schema == PriceQuery.model_json_schema()
        assert cap.output_schema == PriceResult.model_json_schema()
        assert cap.authorized_requester_ids == ["search_agent"]
        assert services[0].online is True
        by_keyword = await me.discover(keywords=["SHOPPING"])
        assert [s.agent_id for s in by_keyword] == ["price_hunter"]


async def test_request_returns_the_result_as_payload_or_model(lobby: LobbyServer) -> None:
    async with PriceHunter(lobby_url=lobby.url), Agent("search_agent", lobby_url=lobby.url) as me:
        raw = await me.request("price_hunter", "find_cheapest_item_price_v2", {"item": "Bose"})
        assert raw == {"item": "Bose", "price": 108.8, "source": "search_agent"}
        typed = await me.request(
            "price_hunter",
            "find_cheapest_item_price_v2",
            PriceQuery(item="Bose"),
            output_type=PriceResult,
        )
        assert typed == PriceResult(item="Bose", price=108.8, source="search_agent")


async def test_request_stream_yields_progress_then_the_result(lobby: LobbyServer) -> None:
    async with PriceHunter(lobby_url=lobby.url), Agent("search_agent", lobby_url=lobby.url) as me:
        updates = [
            u
            async for u in me.request_stream(
                "price_hunter", "find_cheapest_item_price_v2", {"item": "x"}
            )
        ]
    assert updates == [
        {"searched": 1, "status": "in_progress"},
        {"searched": 2, "status": "in_progress"},
        {"item": "x", "price": 108.8, "source": "search_agent"},
    ]


async def test_request_on_progress_sees_each_update_before_the_result(
    lobby: LobbyServer,
) -> None:
    seen: list[dict[str, Any]] = []

    async def on_progress(update: dict[str, Any]) -> None:
        seen.append(update)

    async with PriceHunter(lobby_url=lobby.url), Agent("search_agent", lobby_url=lobby.url) as me:
        result = await me.request(
            "price_hunter",
            "find_cheapest_item_price_v2",
            PriceQuery(item="x"),
            output_type=PriceResult,
            on_progress=on_progress,
        )
    assert seen == [
        {"searched": 1, "status": "in_progress"},
        {"searched": 2, "status": "in_progress"},
    ]
    assert result == PriceResult(item="x", price=108.8, source="search_agent")


async def test_request_on_progress_may_be_a_plain_function(lobby: LobbyServer) -> None:
    seen: list[dict[str, Any]] = []
    async with PriceHunter(lobby_url=lobby.url), Agent("search_agent", lobby_url=lobby.url) as me:
        result = await me.request(
            "price_hunter",
            "find_cheapest_item_price_v2",
            PriceQuery(item="x"),
            output_type=PriceResult,
            on_progress=seen.append,  # not a coroutine function
        )
    assert seen == [
        {"searched": 1, "status": "in_progress"},
        {"searched": 2, "status": "in_progress"},
    ]
    assert result == PriceResult(item="x", price=108.8, source="search_agent")


async def test_invalid_input_is_refused_before_the_handler_runs(lobby: LobbyServer) -> None:
    async with (
        PriceHunter(lobby_url=lobby.url) as hunter,
        Agent("search_agent", lobby_url=lobby.url) as me,
    ):
        with pytest.raises(InvalidInputError) as caught:
            await me.request("price_hunter", "find_cheapest_item_price_v2", {"name": "x"})
        assert caught.value.code == "invalid_input"
        assert "item" in caught.value.message
        assert hunter.calls == 0


async def test_each_failure_raises_its_typed_error(lobby: LobbyServer) -> None:
    async with (
        PriceHunter(lobby_url=lobby.url),
        Agent("search_agent", lobby_url=lobby.url) as me,
        Agent("rogue_007", lobby_url=lobby.url) as rogue,
    ):
        with pytest.raises(UnauthorizedError) as unauthorized:
            await rogue.request("price_hunter", "find_cheapest_item_price_v2", {"item": "x"})
        assert unauthorized.value.message == (
            "Unauthorized: Agent 'rogue_007' is not authorized to call capability "
            "'find_cheapest_item_price_v2' on agent 'price_hunter'."
        )
        # The lobby's text keeps its wire form; the error names the code once.
        assert str(unauthorized.value) == (
            "unauthorized: Agent 'rogue_007' is not authorized to call capability "
            "'find_cheapest_item_price_v2' on agent 'price_hunter'."
        )
        with pytest.raises(CapabilityNotFoundError):
            await me.request("price_hunter", "no_such_capability", {})
        with pytest.raises(UnknownReceiverError):
            await me.request("nobody_here", "anything", {})
        with pytest.raises(RemoteError) as chosen:
            await me.request("price_hunter", "fail_with_code", {})
        assert (chosen.value.code, chosen.value.message) == ("out_of_stock", "out of stock")
        with pytest.raises(RemoteError) as internal:
            await me.request("price_hunter", "crash", {})
        assert internal.value.code == "internal"
        assert "secret" not in internal.value.message
        with pytest.raises(RequestTimeoutError):
            await me.request("price_hunter", "sleep", {"seconds": 5}, timeout=0.2)
        assert isinstance(RequestTimeoutError("x"), TimeoutError)


async def test_a_hanging_handler_does_not_block_other_calls(lobby: LobbyServer) -> None:
    async with (
        PriceHunter(lobby_url=lobby.url, max_concurrency=2) as hunter,
        Agent("search_agent", lobby_url=lobby.url) as me,
    ):
        hanging = asyncio.create_task(me.request("price_hunter", "sleep", {"seconds": 30}))
        await until(lambda: hunter.sleeping == 1, "the hanging handler to start")
        result = await me.request("price_hunter", "find_cheapest_item_price_v2", {"item": "y"})
        assert result["item"] == "y"
        assert not hanging.done()
    # Stopping the caller fails its still-waiting call instead of leaving it hanging.
    assert hanging.done()
    assert isinstance(hanging.exception(), Exception)


async def test_overflow_is_refused_not_queued_without_bound(lobby: LobbyServer) -> None:
    async with (
        PriceHunter(lobby_url=lobby.url, max_concurrency=1, backlog=0) as hunter,
        Agent("search_agent", lobby_url=lobby.url) as me,
    ):
        first = asyncio.create_task(me.request("price_hunter", "sleep", {"seconds": 30}))
        await until(lambda: hunter.sleeping == 1, "the first handler to start")
        with pytest.raises(RemoteError) as refused:
            await me.request("price_hunter", "sleep", {"seconds": 0})
        assert refused.value.code == "rate_limited"
        assert hunter.stats.overflow_dropped == 1
        first.cancel()


class Recorder(Agent):
    """Records every callback, for the lifecycle and catch-all tests."""

    def __init__(self, agent_id: str, **kwargs: Any) -> None:
        super().__init__(agent_id, **kwargs)
        self.events: list[str] = []
        self.messages: list[Message] = []

    async def on_start(self) -> None:
        self.events.append("start")

    async def on_connected(self) -> None:
        self.events.append("connected")

    async def on_disconnected(self) -> None:
        self.events.append("disconnected")

    async def on_stop(self) -> None:
        self.events.append("stop")

    async def on_message(self, message: Message) -> None:
        self.messages.append(message)


async def test_hooks_run_in_order_and_status_is_observable(lobby: LobbyServer) -> None:
    agent = Recorder("recorder", lobby_url=lobby.url)
    seen = [agent.status]
    async with agent:
        seen.append(agent.status)
        assert agent.stats.connects == 1
    seen.append(agent.status)
    assert seen == [Status.IDLE, Status.CONNECTED, Status.STOPPED]
    assert agent.events == ["start", "connected", "stop"]


async def test_a_resent_message_id_runs_the_handler_once(lobby: LobbyServer) -> None:
    """A raw client sends the same message_id twice: the lobby stores and delivers it once."""
    async with Echo("echo", lobby_url=lobby.url) as echo, connect(lobby.url) as ws:
        register = {
            "sender_id": "raw",
            "receiver_id": "global_lobby",
            "message_type": "REGISTER",
            "payload": {},
        }
        await ws.send(orjson.dumps(register).decode())
        token = orjson.loads(await ws.recv())["payload"]["auth_token"]
        request = {
            "sender_id": "raw",
            "receiver_id": "echo",
            "message_type": "REQUEST",
            "payload": {"capability_name": "echo", "n": 1},
            "conversation_id": "c-1",
            "message_id": "m-1",
            "auth_token": token,
        }
        for _ in range(2):
            await ws.send(orjson.dumps(request).decode())
        reply = orjson.loads(await asyncio.wait_for(ws.recv(), BOUND))
        assert reply["payload"] == {"n": 1, "status": "success"}
        assert reply["in_reply_to"] == "m-1"
        # A next REQUEST's RESPONSE comes next: no second answer to m-1 is on its way.
        request.update(payload={"capability_name": "echo", "n": 2}, message_id="m-2")
        await ws.send(orjson.dumps(request).decode())
        reply = orjson.loads(await asyncio.wait_for(ws.recv(), BOUND))
        assert (reply["in_reply_to"], reply["payload"]) == ("m-2", {"n": 2, "status": "success"})
        assert echo.echoed == 2


class Echo(Agent):
    def __init__(self, agent_id: str, **kwargs: Any) -> None:
        super().__init__(agent_id, **kwargs)
        self.echoed = 0

    @capability("echo", description="Returns its input.")
    async def echo(self, request: dict[str, Any], ctx: RequestContext) -> dict[str, Any]:
        self.echoed += 1
        return request


async def test_unsolicited_messages_reach_on_message(lobby: LobbyServer) -> None:
    async with (
        Recorder("listener", lobby_url=lobby.url) as listener,
        Recorder("talker", lobby_url=lobby.url) as talker,
    ):
        await talker.send("listener", MessageType.RESPONSE, {"status": "success"})
        # The lobby refuses a RESPONSE with no open conversation; the talker is told so.
        await until(lambda: talker.messages, "the talker's ERROR")
        assert talker.messages[0].payload["code"] == "unknown_conversation"
        await listener.send("global_lobby", MessageType.ERROR, {"error": "x", "code": "x"})
        await until(lambda: listener.messages, "the listener's ERROR")
        (error,) = listener.messages  # and nothing before it
        assert error.message_type is MessageType.ERROR
        assert error.payload["code"] == "malformed"


async def test_a_taken_agent_id_is_a_registration_error(lobby: LobbyServer) -> None:
    """A second agent with the same id and no token for it (another machine, say)."""
    async with Echo("twin", lobby_url=lobby.url):
        with pytest.raises(RegistrationError) as caught:
            async with Echo("twin", lobby_url=lobby.url, token_store=None):
                pass
        assert caught.value.code == "agent_id_taken"
        assert isinstance(caught.value, AgentIdTakenError)
        assert "has no token for it" in str(caught.value)
        assert "another id" in str(caught.value)


async def test_two_hundred_agents_in_one_process_call_concurrently(lobby: LobbyServer) -> None:
    server = Echo("echo_server", lobby_url=lobby.url)
    clients = [Agent(f"client_{i}", lobby_url=lobby.url) for i in range(200)]
    async with server:
        await asyncio.gather(*(c.__aenter__() for c in clients))
        try:
            results = await asyncio.gather(
                *(c.request("echo_server", "echo", {"i": i}) for i, c in enumerate(clients))
            )
        finally:
            await asyncio.gather(*(c.stop() for c in clients))
    assert results == [{"i": i} for i in range(200)]
    assert server.echoed == 200


async def test_fetch_messages_and_text_callbacks(lobby: LobbyServer) -> None:
    class Reader(Agent):
        def __init__(self) -> None:
            super().__init__("reader", lobby_url=lobby.url)
            self.texts: list[str] = []
            self.release = asyncio.Event()

        async def on_text(self, message: Message, content: str) -> None:
            self.texts.append(content)
            await self.release.wait()  # not done yet: not acknowledged, still held

    async with Reader() as reader, Agent("writer", lobby_url=lobby.url) as writer:
        for word in ("one", "two", "three"):
            await writer.send_text("reader", word)
        await until(lambda: len(reader.texts) == 3, "three TEXTs")
        assert reader.texts == ["one", "two", "three"]
        held, cursor = await reader.fetch_messages(limit=2)
        assert [m.payload["content"] for m in held] == ["one", "two"]
        assert [m.message_type for m in held] == [MessageType.TEXT, MessageType.TEXT]
        rest, cursor = await reader.fetch_messages(since=cursor)
        assert [m.payload["content"] for m in rest] == ["three"]
        reader.release.set()


async def test_a_new_agent_object_under_the_same_id_is_not_taken_for_a_resend(
    lobby: LobbyServer,
) -> None:
    """The lobby drops a message_id it has seen from the same sender_id for a day: an agent
    that registers again under its old id (a restarted process, say) must not reuse one."""
    async with Echo("echoer", lobby_url=lobby.url) as echo:
        async with Agent("asker", lobby_url=lobby.url) as first:
            assert await first.request("echoer", "echo", {"n": 1}) == {"n": 1}
            await first.unregister()
        async with Agent("asker", lobby_url=lobby.url) as second:
            assert await second.request("echoer", "echo", {"n": 2}, timeout=5) == {"n": 2}
        assert echo.echoed == 2


async def test_a_burst_of_sends_arrives_whole_and_in_order(
    lobby: LobbyServer,
) -> None:
    """Sends of one event-loop iteration go out together, in one write, in order."""

    class Collector(Agent):
        def __init__(self) -> None:
            super().__init__("collector", lobby_url=lobby.url)
            self.texts: list[str] = []

        async def on_text(self, message: Message, content: str) -> None:
            self.texts.append(content)

    async with Collector() as collector, Agent("bulk", lobby_url=lobby.url) as bulk:
        body = "x" * 20_000
        await asyncio.gather(*(bulk.send_text("collector", f"{n}:{body}") for n in range(60)))
        await until(lambda: len(collector.texts) == 60, "60 TEXTs")
        assert [t.split(":", 1)[0] for t in collector.texts] == [str(n) for n in range(60)]


async def test_what_was_sent_just_before_the_connection_closes_still_goes_out(
    lobby: LobbyServer,
) -> None:
    """A send is kept for the event-loop iteration's one write; closing the connection within
    that iteration writes it first, ahead of the close frame."""

    class Collector(Agent):
        def __init__(self) -> None:
            super().__init__("collector", lobby_url=lobby.url)
            self.texts: list[str] = []

        async def on_text(self, message: Message, content: str) -> None:
            self.texts.append(content)

    async with (
        Collector() as collector,
        Agent("leaving", lobby_url=lobby.url, reconnect=False) as leaving,
    ):
        link = leaving._sender.link
        assert link is not None
        await leaving.send_text("collector", "last words")
        await link.close()
        await until(lambda: collector.texts == ["last words"], "the TEXT sent before the close")


async def test_a_sender_waits_for_a_full_write_buffer_and_a_flooded_agent_stops_at_once(
    tmp_path: Path,
) -> None:
    """While the lobby reads nothing from it, an agent sending one message after another
    stops once its write buffer is past its bound (nothing piles up without limit), and goes
    on when reading resumes."""
    async with (
        running(tmp_path) as lobby,
        Agent("bulk", lobby_url=lobby.url) as bulk,
        Agent("sink", lobby_url=lobby.url) as sink,
    ):
        sink_link = sink._sender.link
        assert sink_link is not None
        record = lobby.router.registry.get("bulk")
        assert record is not None
        assert record.session is not None
        server_side: ServerConnection = record.session.link  # type: ignore[assignment]
        server_side.transport.pause_reading()
        body = "x" * 50_000
        sent = 0

        async def pump() -> None:
            nonlocal sent
            for n in range(200):
                await bulk.send_text("sink", f"{n}:{body}")
                sent += 1

        sending = asyncio.create_task(pump())
        client_side = bulk._sender.link._ws.transport  # type: ignore[union-attr]
        high = client_side.get_write_buffer_limits()[1]
        # The socket buffers are full once the transport holds more than its high-water mark.
        await until(lambda: client_side.get_write_buffer_size() > high, "a full write buffer")
        assert sent < 200  # 10 MB: more than the socket buffers take
        assert client_side.get_write_buffer_size() < 1_000_000
        server_side.transport.resume_reading()
        async with asyncio.timeout(20):
            await sending
        assert sent == 200
    # The sink stops first, with the lobby still sending to it: it reads on (and drops) what
    # still arrives, so it gets the lobby's answer to its close frame (1000), rather than
    # giving up after websockets' close timeout with the handshake unfinished (1006).
    assert sink_link.close_code == 1000


def _capabilities(count: int) -> list[dict[str, Any]]:
    """`count` capabilities with the word "task", every third with keyword "third"."""
    return [
        {
            "name": f"cap{n:03d}",
            "description": f"does task {n}",
            "keywords": ["third"] * (n % 3 == 0),
        }
        for n in range(count)
    ]


async def test_the_sdk_pages_through_discover_and_search(lobby: LobbyServer) -> None:
    async with (
        connect(lobby.url) as many,
        connect(lobby.url) as more,
        Agent("asker", lobby_url=lobby.url) as me,
    ):
        await register(many, "many", capabilities=_capabilities(450))
        await register(more, "more", capabilities=_capabilities(30))
        services = await me.discover()  # 480 capabilities: five pages of the default 100
        assert [s.agent_id for s in services] == ["many", "more"]
        assert [len(s.relevant_capabilities) for s in services] == [450, 30]
        by_keyword = await me.discover(keywords=["third"], page_size=7)
        assert sum(len(s.relevant_capabilities) for s in by_keyword) == 150 + 10
        top = await me.search("task", limit=300)  # two pages: 200 + 100
        assert sum(len(s.relevant_capabilities) for s in top) == 300
        scores = [s.score for s in top]
        assert all(score is not None for score in scores)
        window = await me.search("cap00", algorithm="simple", limit=1000)  # windows of 500
        names = {(s.agent_id, c.name) for s in window for c in s.relevant_capabilities}
        assert len(names) == 10 + 10
