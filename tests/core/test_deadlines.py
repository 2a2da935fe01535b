"""Deadlines and CANCEL, synchronously through the Router (lobby/core/deadlines.py): the
REQUEST's `timeout_ms` forwarded as `deadline`, the lobby's `timeout` and `cancelled` final
RESPONSEs, the provider's CANCEL, the held copy withdrawn, and a restart in between."""

from __future__ import annotations

from typing import Any

import pytest

from tests.core.test_delivery import restarted, resume
from tests.routerkit import Clock, Peer, cap, frames, join, make_router, raw, world

NOW = 1_700_000_000.0


def setup(acks: bool = True) -> tuple[Clock, Any, Peer, Peer]:
    clock = Clock(NOW)
    router = make_router(clock, dedupe_horizon=60.0)
    alice = join(router, "alice", acks=acks)
    bob = join(router, "bob", capabilities=[cap("c")], acks=acks)
    return clock, router, alice, bob


def call(alice: Peer, timeout_ms: int | None = 5000, message_id: str = "m-1") -> None:
    extra = {} if timeout_ms is None else {"timeout_ms": timeout_ms}
    alice.to(
        "bob",
        "REQUEST",
        {"capability_name": "c"},
        conversation_id="c-1",
        message_id=message_id,
        **extra,
    )


def only(peer: Peer, message_type: str) -> dict[str, Any]:
    received = [m for m in peer.take() if m["message_type"] == message_type]
    assert len(received) == 1, received
    return received[0]


def test_timeout_ms_is_forwarded_as_the_lobbys_deadline() -> None:
    _, _, alice, bob = setup()
    call(alice)
    delivered = only(bob, "REQUEST")
    assert delivered["deadline"] == int(NOW * 1000) + 5000
    assert "timeout_ms" not in delivered


def test_a_deadline_passing_while_the_provider_works_cancels_it_and_times_out() -> None:
    clock, router, alice, bob = setup()
    call(alice)
    bob.take()
    clock.now += 4.9
    assert router.tick() == []
    clock.now += 0.2
    world.deliver(router.tick())
    cancel = only(bob, "CANCEL")
    assert cancel["sender_id"] == "global_lobby"
    assert cancel["conversation_id"] == "c-1"
    assert cancel["in_reply_to"] == "m-1"
    assert cancel["payload"] == {"requester_id": "alice", "reason": "deadline"}
    assert cancel["seq"] == 2
    timeout = only(alice, "RESPONSE")
    assert timeout["sender_id"] == "global_lobby"
    assert timeout["in_reply_to"] == "m-1"
    assert timeout["payload"] == {
        "status": "error",
        "code": "timeout",
        "error": "no final RESPONSE to REQUEST 'm-1' within 5000 ms",
    }
    assert router.conversations == {}
    assert router.registry.get("alice").open_requests == 0
    bob.to("alice", "RESPONSE", {"status": "success"}, conversation_id="c-1")
    assert bob.last()["payload"]["code"] == "unknown_conversation"
    assert router.tick() == []  # once only


def test_a_final_response_before_the_deadline_leaves_nothing_to_fire() -> None:
    clock, router, alice, bob = setup()
    call(alice)
    bob.to("alice", "RESPONSE", {"status": "success"}, conversation_id="c-1", in_reply_to="m-1")
    assert only(alice, "RESPONSE")["payload"] == {"status": "success"}
    clock.now += 10
    assert router.tick() == []
    assert router.requests.deadlines.open == {}


@pytest.mark.parametrize("acks", [True, False])
def test_a_deadline_passing_while_the_provider_is_offline_withdraws_the_request(
    acks: bool,
) -> None:
    clock, router, alice, bob = setup(acks)
    router.close(bob.session)
    call(alice)
    assert len(router.registry.get("bob").mailbox) == 1
    clock.now += 6
    world.deliver(router.tick())
    assert only(alice, "RESPONSE")["payload"]["code"] == "timeout"
    assert list(router.registry.get("bob").mailbox) == []
    # Neither the REQUEST nor a CANCEL.
    assert [m["message_type"] for m in resume(bob, acks=acks)] == ["REGISTER_ACK"]


def test_cancel_by_the_requester_ends_every_open_request_in_the_conversation() -> None:
    _, router, alice, bob = setup()
    call(alice, None, "m-1")
    call(alice, 9000, "m-2")
    bob.take()
    alice.send("CANCEL", {"reason": "changed my mind"}, conversation_id="c-1")
    cancels = [m for m in bob.take() if m["message_type"] == "CANCEL"]
    assert [c["in_reply_to"] for c in cancels] == ["m-1", "m-2"]
    assert {c["payload"]["reason"] for c in cancels} == {"changed my mind"}
    answers = alice.take()
    assert [a["payload"]["code"] for a in answers] == ["cancelled", "cancelled"]
    assert answers[0]["payload"]["error"] == (
        "REQUEST 'm-1' was cancelled by 'alice': changed my mind"
    )
    assert router.conversations == {}
    alice.send("CANCEL", {}, conversation_id="c-1")
    error = alice.last()
    assert error["message_type"] == "ERROR"
    assert error["payload"]["code"] == "unknown_conversation"
    assert error["payload"]["error"] == "no open REQUEST from 'alice' in conversation 'c-1'"


def test_cancel_of_a_request_held_for_an_offline_provider_never_reaches_it() -> None:
    _, router, alice, bob = setup()
    router.close(bob.session)
    call(alice, None)
    alice.send("CANCEL", {}, conversation_id="c-1")
    assert only(alice, "RESPONSE")["payload"]["code"] == "cancelled"
    assert [m["message_type"] for m in resume(bob, acks=True)] == ["REGISTER_ACK"]


def test_only_the_requester_can_cancel_its_requests() -> None:
    _, router, alice, bob = setup()
    call(alice, None)
    bob.send("CANCEL", {}, conversation_id="c-1")
    assert bob.last()["payload"]["code"] == "unknown_conversation"
    assert router.conversations == {("alice", "bob", "c-1"): 1}


@pytest.mark.parametrize(
    ("frame", "problem"),
    [
        (
            {"message_type": "CANCEL", "receiver_id": "bob", "conversation_id": "c-1"},
            "CANCEL is addressed to global_lobby",
        ),
        ({"message_type": "CANCEL"}, "a CANCEL needs a conversation_id"),
        (
            {"message_type": "CANCEL", "conversation_id": "c-1", "payload": {"reason": 5}},
            "a CANCEL's 'reason' is a string of at most 1000 characters",
        ),
        (
            {"message_type": "CANCEL", "conversation_id": "c-1", "payload": {"reason": "x" * 1001}},
            "a CANCEL's 'reason' is a string of at most 1000 characters",
        ),
        (
            {"message_type": "TEXT", "receiver_id": "bob", "timeout_ms": 5},
            "field 'timeout_ms' is for a REQUEST only, not TEXT",
        ),
        (
            {"message_type": "REQUEST", "receiver_id": "bob", "timeout_ms": 0},
            "field 'timeout_ms' is 0; it must be 1 to 86400000 (milliseconds)",
        ),
        (
            {"message_type": "REQUEST", "receiver_id": "bob", "timeout_ms": 86_400_001},
            "field 'timeout_ms' is 86400001; it must be 1 to 86400000 (milliseconds)",
        ),
        (
            {"message_type": "REQUEST", "receiver_id": "bob", "timeout_ms": "5"},
            "field 'timeout_ms' must be an integer or null, not a string",
        ),
        (
            {"message_type": "REQUEST", "receiver_id": "bob", "deadline": 5},
            "field 'deadline' is set by the lobby only",
        ),
        (
            {"message_type": "TEXT", "receiver_id": "bob", "deadline": True},
            "field 'deadline' must be an integer or null, not a boolean",
        ),
    ],
)
def test_malformed_cancels_deadlines_and_timeouts(frame: dict[str, Any], problem: str) -> None:
    _, router, alice, bob = setup()
    call(alice, None)
    bob.take()
    if frame["message_type"] != "CANCEL":
        frame.setdefault("conversation_id", "c-1")
    frame.setdefault("payload", {"capability_name": "c"})
    actions = raw(router, alice.session, sender_id="alice", auth_token=alice.token, **frame)
    (error,) = frames(actions)
    assert error["message_type"] == "ERROR"
    assert error["payload"]["code"] == "malformed"
    assert error["payload"]["error"] == problem
    assert bob.take() == []
    assert router.conversations == {("alice", "bob", "c-1"): 1}


def test_deadlines_survive_a_restart_and_due_ones_fire() -> None:
    clock, router, alice, _ = setup(acks=False)
    call(alice, 5000, "m-1")  # bob is online and without acks: stored as delivered
    router.close(alice.session)
    again = restarted(router, clock)
    assert again.conversations == {("alice", "bob", "c-1"): 1}
    clock.now += 6
    actions = again.tick()
    held = again.registry.agents["alice"].mailbox
    assert len(held) == 1  # alice's `timeout`, held for her
    assert b'"code":"timeout"' in held[0][1]
    assert again.conversations == {}
    world.deliver(actions)


def test_a_request_ended_before_a_restart_stays_ended_and_withdrawn() -> None:
    clock, router, alice, bob = setup()
    router.close(bob.session)
    call(alice, None)
    alice.send("CANCEL", {}, conversation_id="c-1")
    alice.take()
    again = restarted(router, clock)
    assert again.conversations == {}
    assert list(again.registry.agents["bob"].mailbox) == []
    assert again.requests.deadlines.open == {}
    alice.router = again
    alice.send("CANCEL", {}, conversation_id="c-1")
    assert alice.last()["payload"]["code"] == "unknown_conversation"


def test_an_open_request_is_cancellable_after_a_restart() -> None:
    clock, router, alice, _ = setup()
    call(alice, None)
    again = restarted(router, clock)
    alice.router = again
    resume(alice, acks=True)
    alice.send("CANCEL", {}, conversation_id="c-1")
    assert only(alice, "RESPONSE")["payload"]["code"] == "cancelled"
    assert again.conversations == {}
