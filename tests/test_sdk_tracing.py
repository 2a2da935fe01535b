"""agent_sdk carries W3C traces (agent_sdk/tracing.py, agent_sdk/otel.py) against a real lobby:
what a handler sends is in the trace of the message it serves, `RequestContext` and `Move`
expose it, and with `otel` each handled message is a span in that trace."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import NoOpTracerProvider

from agent_sdk import Agent, DialogueHandle, MessageType, RequestContext, capability
from agent_sdk.tracing import current_traceparent
from lobby.server import LobbyServer
from protocol import tracecontext
from tests.waiting import until
from tests.wsclient import running


class Leaf(Agent):
    """Answers `leaf`, noting the trace each call came in."""

    agent_id = "leaf"

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.seen: list[str | None] = []

    @capability("leaf")
    async def leaf(self, request: dict[str, Any], ctx: RequestContext) -> dict[str, Any]:
        self.seen.append(ctx.traceparent)
        return {"ok": True}


class Middle(Agent):
    """Answers `middle` by reporting progress and calling the leaf: both in its call's trace."""

    agent_id = "middle"

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.seen: list[str | None] = []
        self.current: list[str | None] = []

    @capability("middle")
    async def middle(self, request: dict[str, Any], ctx: RequestContext) -> dict[str, Any]:
        self.seen.append(ctx.traceparent)
        self.current.append(current_traceparent())
        await ctx.progress({"step": 1})
        answer: dict[str, Any] = await self.request("leaf", "leaf", {})
        return answer


def trace_of(traceparent: str | None) -> str:
    assert traceparent is not None
    assert tracecontext.problem(traceparent) is None
    return tracecontext.trace_id(traceparent)


async def test_a_handler_sends_in_the_trace_of_the_call_it_serves(lobby: LobbyServer) -> None:
    traceparent = tracecontext.start()
    async with (
        Leaf(lobby_url=lobby.url) as leaf,
        Middle(lobby_url=lobby.url) as middle,
        Agent("caller", lobby_url=lobby.url) as caller,
    ):
        # A raw REQUEST naming its trace; its RESPONSE goes to on_message.
        await caller.send(
            "middle",
            MessageType.REQUEST,
            {"capability_name": "middle"},
            conversation_id="c1",
            traceparent=traceparent,
        )
        await until(lambda: leaf.seen, "the leaf was called")
    (served,), (called,) = middle.seen, leaf.seen
    assert trace_of(served) == trace_of(called) == tracecontext.trace_id(traceparent)
    assert middle.current == [served]  # no spans: passed on as it came


async def test_with_trace_ids_a_call_two_hops_deep_shares_the_lobbys_trace(
    tmp_path: Path,
) -> None:
    async with (
        running(tmp_path, trace_ids=True) as lobby,
        Leaf(lobby_url=lobby.url) as leaf,
        Middle(lobby_url=lobby.url) as middle,
        Agent("caller", lobby_url=lobby.url) as caller,
    ):
        updates = [u async for u in caller.request_stream("middle", "middle", {})]
        assert [u.get("step", u.get("ok")) for u in updates] == [1, True]
        # Outside a handler there is no current trace.
        assert current_traceparent() is None
    (served,) = middle.seen
    assert middle.current == [served]
    (called,) = leaf.seen
    assert trace_of(called) == trace_of(served)
    assert tracecontext.parent_id(called or "") != tracecontext.parent_id(served or "")


async def test_without_a_trace_nothing_is_added(lobby: LobbyServer) -> None:
    async with (
        Leaf(lobby_url=lobby.url) as leaf,
        Middle(lobby_url=lobby.url) as middle,
        Agent("caller", lobby_url=lobby.url) as caller,
    ):
        assert await caller.request("middle", "middle", {}) == {"ok": True}
    assert middle.seen == leaf.seen == [None]


async def test_with_otel_each_handled_message_is_a_span_in_the_callers_trace(
    lobby: LobbyServer,
) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("test")
    async with (
        Leaf(lobby_url=lobby.url, otel=provider) as leaf,
        Middle(lobby_url=lobby.url, otel=provider) as middle,
        Agent("caller", lobby_url=lobby.url, otel=provider) as caller,
    ):
        with tracer.start_as_current_span("checkout") as root:
            assert await caller.request("middle", "middle", {}) == {"ok": True}
    trace = f"{root.get_span_context().trace_id:032x}"
    (served,), (called,) = middle.seen, leaf.seen
    assert trace_of(served) == trace_of(called) == trace
    handled = {
        str((s.attributes or {}).get("messaging.destination.name")): s
        for s in exporter.get_finished_spans()
        if s.name == "handle REQUEST"
    }
    assert sorted(handled) == ["leaf", "middle"]
    assert {f"{s.context.trace_id:032x}" for s in handled.values()} == {trace}
    # What middle sent carried its own span's id.
    middle_span = handled["middle"]
    assert middle.current == [
        f"00-{trace}-{middle_span.context.span_id:016x}-{middle_span.context.trace_flags:02x}"
    ]


class Seller(Agent):
    """Proposes 20 to any CFP and accepts any counter-offer, noting each move's trace."""

    agent_id = "seller"

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.seen: list[str | None] = []

    async def on_cfp(self, dialogue: DialogueHandle, query: dict[str, Any]) -> None:
        self.seen.append(dialogue.traceparent)
        await dialogue.propose({"price": 20, "goods": query})

    async def on_propose(self, dialogue: DialogueHandle, proposal: dict[str, Any]) -> None:
        self.seen.append(current_traceparent())
        await dialogue.accept()


async def test_every_move_of_a_haggle_is_in_the_trace_of_its_cfp(lobby: LobbyServer) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    async with (
        Seller(lobby_url=lobby.url) as seller,
        Agent("buyer", lobby_url=lobby.url, otel=provider) as buyer,
    ):
        with provider.get_tracer("test").start_as_current_span("haggle") as root:
            dialogue = await buyer.cfp("seller", {"apples": 3})
        trace = f"{root.get_span_context().trace_id:032x}"
        offer = await dialogue.next_move(timeout=5)
        assert trace_of(offer.traceparent) == trace
        assert trace_of(dialogue.traceparent) == trace
        # Sent outside any span or handler: in the dialogue's trace all the same.
        await dialogue.propose({"price": 15, "goods": {"apples": 3}})
        accept = await dialogue.next_move(timeout=5)
        deal = await dialogue.conclude(timeout=5)
        assert deal is not None
    assert trace_of(accept.traceparent) == trace
    assert [trace_of(seen) for seen in seller.seen] == [trace, trace]


async def test_with_otel_but_no_tracer_provider_traces_are_still_carried(
    tmp_path: Path,
) -> None:
    async with (
        running(tmp_path, otel=True) as lobby,
        Leaf(lobby_url=lobby.url, otel=NoOpTracerProvider()) as leaf,
        Middle(lobby_url=lobby.url, otel=NoOpTracerProvider()) as middle,
        Agent("caller", lobby_url=lobby.url) as caller,
    ):
        assert await caller.request("middle", "middle", {}) == {"ok": True}
    (served,), (called,) = middle.seen, leaf.seen
    assert trace_of(served) == trace_of(called)
    assert tracecontext.parent_id(served or "") != tracecontext.parent_id(called or "")
