"""REQUEST and RESPONSE, synchronously through the Router: authorization by capability, the open
conversations and their bound, and the refusals (lobby/core/conversations.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from structlog.testing import capture_logs

from lobby.core import Router
from lobby.core.limits import Limits
from lobby.core.records import AgentSaved, Effect, MessageStored, Snapshot
from tests.routerkit import Peer, cap, join, make_router, pair, request

ERROR_KEYS = {"error", "code", "original_message_type", "original_conversation_id"}


def error_code(peer: Peer) -> str:
    error = peer.last()
    assert error["message_type"] == "ERROR"
    assert set(error["payload"]) == ERROR_KEYS
    return str(error["payload"]["code"])


def test_an_authorized_request_and_its_responses_are_forwarded_without_token() -> None:
    router, alice, bob = pair(["alice"])
    request(alice, item="x")
    delivered = bob.last()
    assert delivered["payload"] == {"capability_name": "c", "item": "x"}
    assert "auth_token" not in delivered
    assert delivered["message_id"]
    assert delivered["seq"] == 1
    bob.to("alice", "RESPONSE", {"status": "in_progress"}, conversation_id="k")
    bob.to("alice", "RESPONSE", {"status": "success", "price": 3}, conversation_id="k")
    updates = alice.take()
    assert [u["payload"]["status"] for u in updates] == ["in_progress", "success"]
    assert all("auth_token" not in u for u in updates)
    bob.to("alice", "RESPONSE", {"status": "success"}, conversation_id="k")
    assert error_code(bob) == "unknown_conversation"
    assert router.conversations == {}


def test_the_senders_message_id_is_kept() -> None:
    _, alice, bob = pair()
    alice.to("bob", "REQUEST", {"capability_name": "c"}, conversation_id="k", message_id="mine")
    assert bob.last()["message_id"] == "mine"


def test_unauthorized_gets_the_seeds_error_response() -> None:
    router = make_router()
    join(router, "price_hunter_A2_v2", capabilities=[cap("find", ["search_agent"])])
    rogue = join(router, "rogue_007")
    rogue.to("price_hunter_A2_v2", "REQUEST", {"capability_name": "find"}, conversation_id="k")
    response = rogue.last()
    assert response["message_type"] == "RESPONSE"
    assert response["conversation_id"] == "k"
    assert response["payload"] == {
        "status": "error",
        "code": "unauthorized",
        "error": "Unauthorized: Agent 'rogue_007' is not authorized to call capability 'find' "
        "on agent 'price_hunter_A2_v2'.",
    }
    assert router.conversations == {}


@pytest.mark.parametrize("authorized", [None, []])
def test_null_or_empty_authorization_is_public(authorized: list[str] | None) -> None:
    _, alice, bob = pair(authorized)
    request(alice)
    assert bob.last()["message_type"] == "REQUEST"


def test_unknown_capability_and_receiver_and_missing_conversation() -> None:
    _, alice, bob = pair()
    alice.to("bob", "REQUEST", {"capability_name": "nope"}, conversation_id="k")
    assert alice.last()["payload"]["code"] == "capability_not_found"
    request(alice, to="nobody")
    assert error_code(alice) == "unknown_receiver"
    request(alice, conversation=None)
    assert error_code(alice) == "malformed"
    assert bob.take() == []


def test_only_the_responder_may_answer_and_only_to_the_requester() -> None:
    router, alice, bob = pair()
    mallory = join(router, "mallory")
    request(alice)
    mallory.to("alice", "RESPONSE", {"status": "success"}, conversation_id="k")
    assert error_code(mallory) == "unknown_conversation"
    bob.to("mallory", "RESPONSE", {"status": "success"}, conversation_id="k")
    assert error_code(bob) == "unknown_conversation"
    assert alice.take() == []
    assert mallory.take() == []


def test_open_requests_per_agent_are_bounded_and_freed_by_final_responses() -> None:
    """Every unanswered REQUEST is remembered (so its RESPONSE can be authorized): an agent may
    have at most `max_open_requests` of them, or it could fill the lobby's memory."""
    router = Router(limits=Limits(message_rate=0, registration_rate=0, max_open_requests=2))
    alice = join(router, "alice")
    bob = join(router, "bob", capabilities=[cap("c")])
    request(alice, conversation="k1")
    request(alice, conversation="k2")
    assert len(bob.take()) == 2
    request(alice, conversation="k3")
    assert error_code(alice) == "limit_exceeded"
    assert bob.take() == []
    bob.to("alice", "RESPONSE", {"status": "in_progress"}, conversation_id="k1")
    request(alice, conversation="k3")
    assert error_code(alice) == "limit_exceeded"  # an in_progress RESPONSE answers nothing yet
    bob.to("alice", "RESPONSE", {"status": "success"}, conversation_id="k1")
    request(alice, conversation="k3")
    assert [m["conversation_id"] for m in bob.take()] == ["k3"]
    assert router.registry.agents["alice"].open_requests == 2


def answer(peer: Peer, conversation: str, status: str = "success") -> None:
    peer.to("alice", "RESPONSE", {"status": status}, conversation_id=conversation)


@pytest.mark.parametrize("checkpoint_after", [0, 2, 5])
def test_a_restart_reopens_exactly_the_conversations_left_open(checkpoint_after: int) -> None:
    """The rule that opens and closes conversations live is the one replayed at restore: from
    the stored messages alone, or from a checkpoint plus the messages stored after it."""
    router, alice, bob = pair()
    steps: list[Callable[[], None]] = [
        lambda: request(alice, conversation="k1"),
        lambda: request(alice, conversation="k1"),
        lambda: request(alice, conversation="k2"),
        lambda: request(alice, conversation="k3"),
        lambda: answer(bob, "k1", "in_progress"),
        lambda: answer(bob, "k1"),  # one of k1's two REQUESTs answered
        lambda: answer(bob, "k2", "error"),
    ]
    checkpoint = router.compaction()
    for number, step in enumerate(steps, 1):
        step()
        if number == checkpoint_after:
            checkpoint = router.compaction()
    assert router.conversations == {("alice", "bob", "k1"): 1, ("alice", "bob", "k3"): 1}
    records = router.take_journal().records
    # Rows that open nothing come first: one for an agent since removed, one without a
    # conversation (a TEXT). Each is passed over, and the rows after them still count.
    after = checkpoint.upto_row + 1
    passed_over = [
        MessageStored(after, "gone", 1, "alice", "g", "k9", Effect.OPENS, b"{}", 0.0),
        MessageStored(after, "bob", 99, "alice", "t", None, Effect.NONE, b"{}", 0.0),
    ]
    snapshot = Snapshot(
        agents=[r for r in records if isinstance(r, AgentSaved)],
        messages=passed_over + [r for r in records if isinstance(r, MessageStored)],
        conversations=checkpoint.conversations,
        conversations_upto=checkpoint.upto_row,
    )
    restarted = make_router()
    with capture_logs() as logs:
        restarted.restore(snapshot)
    assert restarted.conversations == router.conversations
    assert [e["open_conversations"] for e in logs if e["event"] == "LOBBY_RESTORED"] == [2]
    assert restarted.registry.agents["alice"].open_requests == 2


def refusal(peer: Peer) -> tuple[str, str]:
    error = peer.last()
    assert error["message_type"] == "ERROR"
    return error["payload"]["code"], error["payload"]["error"]


def test_each_request_and_response_refusal_says_what_is_wrong_and_is_counted() -> None:
    router, alice, bob = pair()
    alice.to("bob", "REQUEST", {"capability_name": 3}, conversation_id="k")
    assert refusal(alice) == ("malformed", "a REQUEST payload needs a string 'capability_name'")
    request(alice, conversation=None)
    assert refusal(alice) == ("malformed", "a REQUEST needs a conversation_id")
    alice.to("bob", "REQUEST", {"capability_name": "nope"}, conversation_id="k", message_id="q")
    denied = alice.last()
    assert (denied["message_type"], denied["conversation_id"]) == ("RESPONSE", "k")
    assert denied["in_reply_to"] == "q"
    assert denied["payload"] == {
        "status": "error",
        "code": "capability_not_found",
        "error": "Capability 'nope' not found on agent 'bob'.",
    }
    bob.to("alice", "RESPONSE", {"status": 1}, conversation_id="k")
    assert refusal(bob) == ("malformed", "a RESPONSE payload needs a string 'status'")
    bob.to("alice", "RESPONSE", {"status": "success"}, conversation_id="k")
    assert refusal(bob) == (
        "unknown_conversation",
        "no open REQUEST from 'alice' to 'bob' in conversation 'k'",
    )
    bob.to("alice", "RESPONSE", {"status": "success"})
    assert refusal(bob) == (
        "unknown_conversation",
        "no open REQUEST from 'alice' to 'bob' in conversation None",
    )
    assert bob.take() == []
    assert alice.take() == []
    refused = {code: count for code, count in router.counters.refused.items() if count}
    assert refused == {"malformed": 3, "capability_not_found": 1, "unknown_conversation": 2}


def test_an_empty_conversation_id_is_answered_by_it_and_not_by_a_response_without_one() -> None:
    router, alice, bob = pair()
    alice.to("bob", "REQUEST", {"capability_name": "c"}, conversation_id="")
    assert bob.last()["conversation_id"] == ""
    bob.to("alice", "RESPONSE", {"status": "success"})
    assert refusal(bob) == (
        "unknown_conversation",
        "no open REQUEST from 'alice' to 'bob' in conversation None",
    )
    assert router.conversations == {("alice", "bob", ""): 1}
    bob.to("alice", "RESPONSE", {"status": "success"}, conversation_id="")
    answer = alice.last()
    assert (answer["message_type"], answer["conversation_id"]) == ("RESPONSE", "")
    assert router.conversations == {}


def test_a_requester_over_its_bound_is_told_how_many_it_has_waiting() -> None:
    router = Router(limits=Limits(message_rate=0, registration_rate=0, max_open_requests=1))
    alice = join(router, "alice")
    join(router, "bob", capabilities=[cap("c")])
    request(alice, conversation="k1")
    request(alice, conversation="k2")
    assert refusal(alice) == (
        "limit_exceeded",
        "agent 'alice' already has 1 REQUESTs waiting for a final RESPONSE; this one was not "
        "routed",
    )


def test_each_denied_request_is_counted_by_its_code() -> None:
    router = make_router()
    join(router, "bob", capabilities=[cap("c", ["alice"])])
    mallory = join(router, "mallory")
    for _ in range(2):
        request(mallory)
        assert mallory.last()["payload"]["code"] == "unauthorized"
    assert router.counters.refused["unauthorized"] == 2


def test_a_response_to_a_requester_gone_closes_its_conversation() -> None:
    router, alice, bob = pair()
    request(alice)
    request(alice, conversation="k2")
    bob.take()
    alice.send("UNREGISTER", {})
    bob.to("alice", "RESPONSE", {"status": "success"}, conversation_id="k")
    assert refusal(bob) == ("unknown_receiver", "no agent 'alice' is registered")
    assert router.conversations == {("alice", "bob", "k2"): 1}


def test_each_final_response_frees_one_of_its_requesters_waiting_requests() -> None:
    router, alice, bob = pair()
    for conversation in ("k1", "k2", "k3"):
        request(alice, conversation=conversation)
    waiting = router.registry.agents["alice"]
    assert waiting.open_requests == 3
    answer(bob, "k1", "in_progress")
    assert waiting.open_requests == 3
    answer(bob, "k1")
    assert waiting.open_requests == 2
    answer(bob, "k2", "error")
    answer(bob, "k3")
    assert waiting.open_requests == 0


def test_a_denial_and_an_authorized_request_are_logged_with_their_parties() -> None:
    router = make_router(trace=True)
    alice = join(router, "alice")
    join(router, "bob", capabilities=[cap("c", ["alice"])])
    mallory = join(router, "mallory")
    with capture_logs() as events:
        request(mallory)
        request(alice)
    parties = {
        "requester": None,
        "responder": "bob",
        "capability": "c",
        "conversation_id": "k",
    }
    logged = [
        {key: event.get(key) for key in ("event", *parties)}
        for event in events
        if event["event"].startswith("REQUEST_")
    ]
    assert logged == [
        {"event": "REQUEST_DENIED_AUTHORIZATION", **parties, "requester": "mallory"},
        {"event": "REQUEST_AUTHORIZED", **parties, "requester": "alice"},
    ]


def test_a_resent_response_reaches_the_requester_once() -> None:
    _, alice, bob = pair()
    request(alice)
    bob.take()
    for _ in range(2):
        bob.to("alice", "RESPONSE", {"status": "in_progress"}, conversation_id="k", message_id="r")
    assert [m["message_id"] for m in alice.take()] == ["r"]
    assert bob.take() == []  # a resend is not refused


def test_a_response_with_its_own_trace_keeps_it() -> None:
    _, alice, bob = pair()
    traced = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    alice.to("bob", "REQUEST", {"capability_name": "c"}, conversation_id="k", traceparent=traced)
    own = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    bob.to("alice", "RESPONSE", {"status": "success"}, conversation_id="k", traceparent=own)
    assert alice.last()["traceparent"].split("-")[1] == "0af7651916cd43dd8448eb211c80319c"
    # An untraced conversation closes while a traced one is open: nothing to forget for it.
    alice.to("bob", "REQUEST", {"capability_name": "c"}, conversation_id="t", traceparent=traced)
    request(alice, conversation="u")
    bob.to("alice", "RESPONSE", {"status": "success"}, conversation_id="u")
    assert alice.last()["conversation_id"] == "u"


NAMED = {"type": "object", "properties": {"item": {"type": "string"}}, "required": ["item"]}


@pytest.mark.parametrize("form", [None, "flat", "object"])
def test_arguments_in_either_form_reach_a_capability_in_the_form_it_asks_for(
    form: str | None,
) -> None:
    router = make_router()
    alice = join(router, "alice")
    extra: dict[str, Any] = {"arguments_form": form} if form else {}
    bob = join(router, "bob", capabilities=[cap("c", input_schema=NAMED, **extra)])
    wanted = (
        {"capability_name": "c", "arguments": {"item": "x"}}
        if form == "object"
        else {"capability_name": "c", "item": "x"}
    )
    for conversation, sent in (("k1", {"item": "x"}), ("k2", {"arguments": {"item": "x"}})):
        request(alice, conversation=conversation, **sent)
        assert bob.last()["payload"] == wanted
    # Checked against the input schema in either form: `path` points into the arguments.
    request(alice, conversation="k3", arguments={"item": 5})
    refused = alice.last()["payload"]
    assert (refused["code"], refused["path"]) == ("invalid_input", "/item")
    assert bob.take() == []


def test_an_argument_named_arguments_stays_flat() -> None:
    """The object form is `arguments` alone beside `capability_name`, as an object, for a
    capability whose input schema has no `arguments` property: anything else is flat."""
    router = make_router()
    alice = join(router, "alice")
    declared = {"type": "object", "properties": {"arguments": {"type": "object"}}}
    bob = join(router, "bob", capabilities=[cap("c"), cap("d", input_schema=declared)])
    flat: list[dict[str, Any]] = [{"arguments": 1}, {"arguments": {"a": 1}, "b": 2}]
    for n, arguments in enumerate(flat):
        request(alice, conversation=f"k{n}", **arguments)
        assert bob.last()["payload"] == {"capability_name": "c", **arguments}
    alice.to("bob", "REQUEST", {"capability_name": "d", "arguments": {"a": 1}}, conversation_id="k")
    assert bob.last()["payload"] == {"capability_name": "d", "arguments": {"a": 1}}
