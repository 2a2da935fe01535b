"""Trace Context through the Router, synchronously (lobby/core/tracing.py and the handlers that
remember a conversation's trace): a traceparent is kept on everything forwarded with a new
parent-id per hop, a REQUEST's RESPONSEs, a dialogue's moves and a proposal's PAYMENT join
its trace, the lobby's notices and refusals carry the trace of what caused them, and at DEBUG
each routed message, move and payment is one log line without a token."""

from __future__ import annotations

from typing import Any

import orjson
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from structlog.testing import capture_logs

from lobby.core.tracing import Tracing
from lobby.otel import OtelTracing
from protocol import tracecontext
from tests.routerkit import Peer, join, make_router

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
TRACEPARENT = f"00-{TRACE}-00f067aa0ba902b7-01"
ORDER = {"items": [{"id": "1", "name": "tea", "price": 2, "quantity": 1}], "total_price": 2}


def pair(**router_options: Any) -> tuple[Peer, Peer, Any]:
    router = make_router(**router_options)
    return (
        join(router, "alice", acks=True),
        join(router, "bob", capabilities=[{"name": "echo"}]),
        router,
    )


def trace_of(message: dict[str, Any]) -> str:
    traceparent = message["traceparent"]
    assert tracecontext.problem(traceparent) is None
    return tracecontext.trace_id(traceparent)


def test_a_request_keeps_its_trace_with_a_new_parent_id_and_its_responses_join_it() -> None:
    alice, bob, _ = pair()
    alice.to(
        "bob", "REQUEST", {"capability_name": "echo"}, conversation_id="c1", traceparent=TRACEPARENT
    )
    request = bob.last()
    assert trace_of(request) == TRACE
    assert tracecontext.parent_id(request["traceparent"]) != "00f067aa0ba902b7"
    assert request["traceparent"].endswith("-01")  # the sender's flags are kept
    # Neither RESPONSE names a trace: both join the REQUEST's.
    bob.to("alice", "RESPONSE", {"status": "in_progress"}, conversation_id="c1")
    bob.to("alice", "RESPONSE", {"status": "success"}, conversation_id="c1")
    update, final = alice.take()
    assert trace_of(update) == trace_of(final) == TRACE
    assert tracecontext.parent_id(update["traceparent"]) != tracecontext.parent_id(
        final["traceparent"]
    )


def test_untraced_messages_stay_untraced_unless_trace_ids_are_on() -> None:
    alice, bob, _ = pair()
    alice.to("bob", "REQUEST", {"capability_name": "echo"}, conversation_id="c1")
    assert "traceparent" not in bob.last()
    alice, bob, router = pair(tracing=Tracing(start_traces=True))
    alice.to("bob", "REQUEST", {"capability_name": "echo"}, conversation_id="c1")
    started = trace_of(bob.last())
    bob.to("alice", "RESPONSE", {"status": "success"}, conversation_id="c1")
    assert trace_of(alice.last()) == started
    # Another conversation: another trace; the closed one is forgotten.
    alice.to("bob", "REQUEST", {"capability_name": "echo"}, conversation_id="c2")
    assert trace_of(bob.last()) != started
    assert list(router.requests.traces) == [("alice", "bob", "c2")]


def test_the_accepted_and_a_refusal_carry_the_trace_of_their_message() -> None:
    alice, _, router = pair()
    alice.to(
        "bob",
        "REQUEST",
        {"capability_name": "echo"},
        conversation_id="c1",
        message_id="m1",
        traceparent=TRACEPARENT,
    )
    accepted = [orjson.loads(action.frame) for action in router.committed(router.take_journal())]
    assert [(m["message_type"], trace_of(m)) for m in accepted] == [("ACCEPTED", TRACE)]
    alice.to("bob", "TEXT", {"content": "again"}, message_id="m2", traceparent=TRACEPARENT)
    accepted = [orjson.loads(action.frame) for action in router.committed(router.take_journal())]
    assert [(m["payload"], trace_of(m)) for m in accepted] == [({"message_id": "m2"}, TRACE)]
    alice.to(
        "bob", "REQUEST", {"capability_name": "nope"}, conversation_id="c2", traceparent=TRACEPARENT
    )
    denied = alice.last()
    assert (denied["payload"]["code"], trace_of(denied)) == ("capability_not_found", TRACE)
    alice.to("nobody", "TEXT", {"content": "hi"}, traceparent=TRACEPARENT)
    error = alice.last()
    assert (error["payload"]["code"], trace_of(error)) == ("unknown_receiver", TRACE)


def test_a_haggle_and_its_confirmation_share_the_cfps_trace() -> None:
    router = make_router()
    buyer, seller = join(router, "b"), join(router, "s")
    moves: list[tuple[Peer, str, str, str, str | None, dict[str, Any]]] = [
        (buyer, "s", "CFP", "1", None, {"query": {"goods": "tea"}}),
        (seller, "b", "PROPOSE", "2", "1", {"proposal": {"price": 20, "goods": "tea"}}),
        (buyer, "s", "ACCEPT", "3", "2", {}),
        (seller, "b", "MATCH_ACCEPT", "4", "3", {}),
    ]
    with capture_logs() as lines:
        for peer, to, kind, move_id, target, payload in moves:
            envelope: dict[str, Any] = {"conversation_id": "d1", "message_id": move_id}
            if target is not None:
                envelope["in_reply_to"] = target
            if kind == "CFP":
                envelope["traceparent"] = TRACEPARENT
            peer.to(to, kind, payload, **envelope)
    received = buyer.take() + seller.take()
    kinds = sorted(m["message_type"] for m in received)
    assert kinds == [
        "ACCEPT",
        "CFP",
        "MATCH_ACCEPT",
        "PROPOSE",
        "TRANSACTION_CONFIRMED",
        "TRANSACTION_CONFIRMED",
    ]
    assert {trace_of(m) for m in received} == {TRACE}
    assert lines == []  # DEBUG lines are only made with trace on


def test_a_payment_joins_its_proposals_trace_and_so_does_its_confirmation() -> None:
    router = make_router(tracing=Tracing(start_traces=True))
    shop, alice = join(router, "shop"), join(router, "alice")
    shop.to("alice", "ORDER_PROPOSAL", ORDER, message_id="p1", conversation_id="c")
    trace = trace_of(alice.last())
    alice.to("shop", "PAYMENT", {"amount": 2, "proposal_message_id": "p1"}, conversation_id="c")
    received = shop.take() + alice.take()
    assert sorted(m["message_type"] for m in received) == [
        "PAYMENT",
        "PAYMENT_CONFIRMED",
        "PAYMENT_CONFIRMED",
    ]
    assert {trace_of(m) for m in received} == {trace}


def test_at_debug_each_routed_message_move_and_payment_is_one_line_without_a_token() -> None:
    router = make_router(trace=True)
    buyer, seller = join(router, "b"), join(router, "s")
    with capture_logs() as lines:
        buyer.to(
            "s", "CFP", {"query": {}}, conversation_id="d1", message_id="1", traceparent=TRACEPARENT
        )
        seller.to(
            "b",
            "PROPOSE",
            {"proposal": {"price": 3}},
            conversation_id="d1",
            message_id="2",
            in_reply_to="1",
        )
        seller.to("b", "ORDER_PROPOSAL", ORDER, message_id="p1", conversation_id="c")
        buyer.to("s", "PAYMENT", {"amount": 2, "proposal_message_id": "p1"}, conversation_id="c")
    events = [(line["event"], line.get("type") or line.get("move")) for line in lines]
    assert events == [
        ("MESSAGE_ROUTED", "CFP"),
        ("DIALOGUE_MOVE", "CFP"),
        ("MESSAGE_ROUTED", "PROPOSE"),
        ("DIALOGUE_MOVE", "PROPOSE"),
        ("MESSAGE_ROUTED", "ORDER_PROPOSAL"),
        ("MESSAGE_ROUTED", "PAYMENT"),
        ("PAYMENT_ACCEPTED", None),
        ("MESSAGE_ROUTED", "PAYMENT_CONFIRMED"),
        ("MESSAGE_ROUTED", "PAYMENT_CONFIRMED"),
    ]
    first = lines[0]
    assert (first["sender"], first["receiver"], first["conversation_id"], first["trace_id"]) == (
        "b",
        "s",
        "d1",
        TRACE,
    )
    assert (first["type"], first["message_id"], first["seq"]) == ("CFP", "1", 1)
    assert (lines[1]["state_before"], lines[1]["state_after"]) == (None, "cfp_sent")
    assert (lines[1]["dialogue_id"], lines[1]["sender"], lines[1]["receiver"]) == ("d1", "b", "s")
    assert (lines[3]["state_before"], lines[3]["trace_id"]) == ("cfp_sent", TRACE)
    assert (lines[6]["amount"], lines[6]["payer"]) == ("2.00", "b")
    tokens = {buyer.token, seller.token}
    assert not any(token in repr(line) for line in lines for token in tokens)


def test_with_otel_each_hop_is_a_span_addressed_to_the_receiver_of_its_frame() -> None:
    """`Tracing.hop` is told whom each frame is for: the OpenTelemetry spans name it."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    alice, bob, router = pair(tracing=OtelTracing(provider))
    alice.to(
        "bob",
        "REQUEST",
        {"capability_name": "echo"},
        conversation_id="c1",
        message_id="m1",
        traceparent=TRACEPARENT,
    )
    bob.to("alice", "RESPONSE", {"status": "success"}, conversation_id="c1")  # joins the trace
    alice.to(
        "bob", "REQUEST", {"capability_name": "nope"}, conversation_id="c2", traceparent=TRACEPARENT
    )
    bob.to("nobody", "TEXT", {"content": "hi"}, traceparent=TRACEPARENT)
    frames = [
        *(orjson.loads(action.frame) for action in router.committed(router.take_journal())),
        *alice.take(),
        *bob.take(),
    ]
    spans = {f"{span.context.span_id:016x}": span for span in exporter.get_finished_spans()}
    hops = sorted(
        (
            frame["message_type"],
            frame["receiver_id"],
            spans[tracecontext.parent_id(frame["traceparent"])].attributes[  # type: ignore[index]
                "messaging.destination.name"
            ],
        )
        for frame in frames
    )
    assert hops == [
        ("ACCEPTED", "alice", "alice"),
        ("ERROR", "bob", "bob"),
        ("REQUEST", "bob", "bob"),
        ("RESPONSE", "alice", "alice"),
        ("RESPONSE", "alice", "alice"),
    ]


def test_the_lobbys_answers_to_a_traced_question_are_in_its_trace() -> None:
    alice, _, _ = pair()
    alice.send("LIST_TRANSACTIONS", {}, traceparent=TRACEPARENT)
    answer = alice.last()
    assert (answer["message_type"], trace_of(answer)) == ("TRANSACTIONS", TRACE)
    assert tracecontext.parent_id(answer["traceparent"]) != "00f067aa0ba902b7"  # its own hop


def test_a_dialogue_keeps_the_trace_of_its_first_traced_move() -> None:
    router = make_router()
    buyer, seller = join(router, "b"), join(router, "s")
    other = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    buyer.to("s", "CFP", {"query": {}}, conversation_id="d1", message_id="1")
    seller.to(
        "b",
        "PROPOSE",
        {"proposal": {"price": 3}},
        conversation_id="d1",
        message_id="2",
        in_reply_to="1",
        traceparent=TRACEPARENT,
    )
    buyer.to(
        "s", "ACCEPT", {}, conversation_id="d1", message_id="3", in_reply_to="2", traceparent=other
    )
    seller.to("b", "MATCH_ACCEPT", {}, conversation_id="d1", message_id="4", in_reply_to="3")
    match_accept, confirmed = buyer.take()[-2:]
    assert (match_accept["message_type"], trace_of(match_accept)) == ("MATCH_ACCEPT", TRACE)
    assert (confirmed["message_type"], trace_of(confirmed)) == ("TRANSACTION_CONFIRMED", TRACE)
