"""Trace Context over real sockets: a REQUEST and its RESPONSEs share the trace whether or not
the REQUEST brought one, a haggle and a payment share one trace, a malformed traceparent is
refused, `lobby serve --otel` records a span per hop, and `--log-level debug` logs each routed
message (PROTOCOL.md, "Tracing")."""

from __future__ import annotations

import signal
from dataclasses import replace
from pathlib import Path
from typing import Any

import websockets.asyncio.client
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from lobby.core.router import Router
from lobby.otel import OtelTracing
from lobby.server import LobbyServer
from protocol import tracecontext
from tests.conftest import SETTINGS, start_lobby_process
from tests.waiting import until
from tests.wsclient import Client, frame, reply, running, token_of

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
TRACEPARENT = f"00-{TRACE}-00f067aa0ba902b7-01"
ECHO = [{"name": "echo"}]
ORDER = {"items": [{"id": "1", "name": "tea", "price": 2, "quantity": 1}], "total_price": 2}


def trace_of(message: dict[str, Any]) -> str:
    traceparent = message["traceparent"]
    assert tracecontext.problem(traceparent) is None
    return tracecontext.trace_id(traceparent)


async def call(
    alice: Client, atoken: str, bob: Client, btoken: str, cid: str, **envelope: Any
) -> tuple[dict[str, Any], dict[str, Any]]:
    """alice REQUESTs bob's echo (with `envelope`); bob answers without a traceparent.
    What bob received, and the RESPONSE alice received."""
    await alice.send(
        frame(
            "alice",
            "REQUEST",
            {"capability_name": "echo"},
            receiver_id="bob",
            conversation_id=cid,
            auth_token=atoken,
            **envelope,
        )
    )
    request = await reply(bob)
    await bob.send(
        frame(
            "bob",
            "RESPONSE",
            {"status": "success"},
            receiver_id="alice",
            conversation_id=cid,
            auth_token=btoken,
        )
    )
    return request, await reply(alice)


async def test_a_request_and_its_response_share_the_trace_it_came_with(
    lobby: LobbyServer,
) -> None:
    async with (
        websockets.asyncio.client.connect(lobby.url) as alice,
        websockets.asyncio.client.connect(lobby.url) as bob,
    ):
        atoken = await token_of(alice, "alice")
        btoken = await token_of(bob, "bob", capabilities=ECHO)
        request, response = await call(alice, atoken, bob, btoken, "c1", traceparent=TRACEPARENT)
        assert trace_of(request) == trace_of(response) == TRACE
        assert tracecontext.parent_id(request["traceparent"]) != "00f067aa0ba902b7"
        assert "auth_token" not in request
        # Without one, and trace ids off (the default): nothing is added.
        request, response = await call(alice, atoken, bob, btoken, "c2")
        assert "traceparent" not in request
        assert "traceparent" not in response


async def test_with_trace_ids_the_lobby_starts_the_trace_of_an_untraced_request(
    tmp_path: Path,
) -> None:
    async with (
        running(tmp_path, trace_ids=True) as lobby,
        websockets.asyncio.client.connect(lobby.url) as alice,
        websockets.asyncio.client.connect(lobby.url) as bob,
    ):
        atoken = await token_of(alice, "alice")
        btoken = await token_of(bob, "bob", capabilities=ECHO)
        request, response = await call(alice, atoken, bob, btoken, "c1")
        assert trace_of(request) == trace_of(response)
        again, _ = await call(alice, atoken, bob, btoken, "c2")
        assert trace_of(again) != trace_of(request)


async def test_a_haggle_and_the_payment_after_it_share_one_trace(tmp_path: Path) -> None:
    async with (
        running(tmp_path) as lobby,
        websockets.asyncio.client.connect(lobby.url) as buyer,
        websockets.asyncio.client.connect(lobby.url) as seller,
    ):
        tokens = {"b": await token_of(buyer, "b"), "s": await token_of(seller, "s")}
        peers = {"b": buyer, "s": seller}

        async def send(
            sender: str, to: str, kind: str, payload: Any, **envelope: Any
        ) -> dict[str, Any]:
            """Send one message; what its receiver got."""
            await peers[sender].send(
                frame(sender, kind, payload, receiver_id=to, auth_token=tokens[sender], **envelope)
            )
            return await reply(peers[to])

        # Only the CFP and the order name the trace; every other message joins it.
        tp = TRACEPARENT
        seen = [
            await send(
                "b", "s", "CFP", {"query": {}}, conversation_id="d", message_id="1", traceparent=tp
            ),
            await send(
                "s",
                "b",
                "PROPOSE",
                {"proposal": {"price": 2}},
                conversation_id="d",
                message_id="2",
                in_reply_to="1",
            ),
            await send(
                "b", "s", "ACCEPT", {}, conversation_id="d", message_id="3", in_reply_to="2"
            ),
            await send(
                "s", "b", "MATCH_ACCEPT", {}, conversation_id="d", message_id="4", in_reply_to="3"
            ),
            await reply(buyer),  # TRANSACTION_CONFIRMED, to both
            await reply(seller),
            await send(
                "s",
                "b",
                "ORDER_PROPOSAL",
                ORDER,
                conversation_id="d",
                message_id="p1",
                traceparent=tp,
            ),
            await send(
                "b", "s", "PAYMENT", {"amount": 2, "proposal_message_id": "p1"}, conversation_id="d"
            ),
            await reply(seller),  # PAYMENT_CONFIRMED, to both
            await reply(buyer),
        ]
        kinds = [m["message_type"] for m in seen]
        assert kinds == [
            "CFP",
            "PROPOSE",
            "ACCEPT",
            "MATCH_ACCEPT",
            "TRANSACTION_CONFIRMED",
            "TRANSACTION_CONFIRMED",
            "ORDER_PROPOSAL",
            "PAYMENT",
            "PAYMENT_CONFIRMED",
            "PAYMENT_CONFIRMED",
        ]
        assert {trace_of(m) for m in seen} == {TRACE}


async def test_a_malformed_traceparent_is_refused_and_nothing_is_routed(
    lobby: LobbyServer,
) -> None:
    async with (
        websockets.asyncio.client.connect(lobby.url) as alice,
        websockets.asyncio.client.connect(lobby.url) as bob,
    ):
        atoken = await token_of(alice, "alice")
        await token_of(bob, "bob", capabilities=ECHO)
        for bad in ("00-xyz", TRACEPARENT.replace(TRACE, "0" * 32), 42):
            await alice.send(
                frame(
                    "alice",
                    "REQUEST",
                    {"capability_name": "echo"},
                    receiver_id="bob",
                    conversation_id="c1",
                    auth_token=atoken,
                    traceparent=bad,
                )
            )
            error = await reply(alice)
            assert error["message_type"] == "ERROR"
            assert error["payload"]["code"] == "malformed"
            assert "'traceparent'" in error["payload"]["error"]
            assert error["payload"]["original_conversation_id"] == "c1"
        # bob got nothing: the next thing he sees is a message sent after the refusals.
        await alice.send(
            frame("alice", "TEXT", {"content": "hi"}, receiver_id="bob", auth_token=atoken)
        )
        assert (await reply(bob))["message_type"] == "TEXT"


async def test_with_otel_each_hop_is_a_span_and_its_id_the_parent_the_receiver_gets(
    tmp_path: Path,
) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    settings = replace(SETTINGS, data_dir=tmp_path, otel=True)
    lobby = LobbyServer(settings, router=Router(tracing=OtelTracing(provider)))
    await lobby.start()
    try:
        async with (
            websockets.asyncio.client.connect(lobby.url) as alice,
            websockets.asyncio.client.connect(lobby.url) as bob,
        ):
            atoken = await token_of(alice, "alice")
            btoken = await token_of(bob, "bob", capabilities=ECHO)
            request, response = await call(
                alice, atoken, bob, btoken, "c1", traceparent=TRACEPARENT
            )
            untraced, _ = await call(alice, atoken, bob, btoken, "c2")
    finally:
        await lobby.stop()
    spans = {f"{span.context.span_id:016x}": span for span in exporter.get_finished_spans()}
    hop = spans[tracecontext.parent_id(request["traceparent"])]
    assert hop.name == "route REQUEST"
    assert f"{hop.context.trace_id:032x}" == TRACE
    assert hop.parent is not None
    assert f"{hop.parent.span_id:016x}" == "00f067aa0ba902b7"
    assert hop.attributes is not None
    assert hop.attributes["lobby.sender_id"] == "alice"
    assert hop.attributes["messaging.destination.name"] == "bob"
    answer = spans[tracecontext.parent_id(response["traceparent"])]
    assert (answer.name, answer.context.trace_id) == ("route RESPONSE", hop.context.trace_id)
    # A message that came without a trace starts one, rooted at the lobby's span.
    root = spans[tracecontext.parent_id(untraced["traceparent"])]
    assert root.parent is None
    assert root.context.trace_id != hop.context.trace_id


async def test_at_log_level_debug_each_routed_message_is_one_line_without_a_token(
    tmp_path: Path,
) -> None:
    proc = start_lobby_process(tmp_path / "data", "--log-level", "debug", "--trace-ids")
    try:
        url = f"ws://127.0.0.1:{proc.port}/"
        async with (
            websockets.asyncio.client.connect(url) as alice,
            websockets.asyncio.client.connect(url) as bob,
        ):
            atoken = await token_of(alice, "alice")
            btoken = await token_of(bob, "bob", capabilities=ECHO)
            request, _ = await call(alice, atoken, bob, btoken, "c1")
        trace = trace_of(request)

        def routed() -> list[dict[str, Any]]:
            return [e for e in proc.events() if e.get("event") == "MESSAGE_ROUTED"]

        await until(lambda: len(routed()) == 2, "two MESSAGE_ROUTED lines")
        assert [
            (e["type"], e["sender"], e["receiver"], e["conversation_id"], e["trace_id"])
            for e in routed()
        ] == [
            ("REQUEST", "alice", "bob", "c1", trace),
            ("RESPONSE", "bob", "alice", "c1", trace),
        ]
        log = proc.log_path.read_text()
        assert atoken not in log
        assert btoken not in log
    finally:
        proc.signal(signal.SIGTERM)
        proc.wait(10)
