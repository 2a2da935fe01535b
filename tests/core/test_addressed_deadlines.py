"""A capability-addressed REQUEST with a deadline, CANCELled, and failed over: the lobby's
`timeout` and `cancelled` answers reach the provider holding it at that moment, never one it
was taken from (lobby/core/addressed.py with lobby/core/deadlines.py)."""

from __future__ import annotations

from typing import Any

from tests.core.test_addressed import fail_over, providers
from tests.core.test_deadlines import NOW, only
from tests.routerkit import Clock, Peer, join, make_router, world


def setup() -> tuple[Clock, Any, Peer, Peer, Peer]:
    clock = Clock(NOW)
    router = make_router(clock, dedupe_horizon=60.0)
    bob, carol = providers(router, "bob", "carol", acks=True)
    alice = join(router, "alice", acks=True)
    return clock, router, alice, bob, carol


def call(alice: Peer, timeout_ms: int | None = 5000) -> None:
    extra = {} if timeout_ms is None else {"timeout_ms": timeout_ms}
    alice.send(
        "REQUEST",
        {"capability_name": "quote", "arguments": {"n": 1}},
        conversation_id="k",
        message_id="m-1",
        **extra,
    )


def test_the_provider_chosen_gets_the_deadline_and_the_lobby_ends_it_there() -> None:
    clock, router, alice, bob, carol = setup()
    call(alice)
    delivered = only(bob, "REQUEST")
    assert delivered["deadline"] == int(NOW * 1000) + 5000
    assert "timeout_ms" not in delivered
    clock.now += 5.1
    world.deliver(router.tick())
    assert only(bob, "CANCEL")["payload"] == {"requester_id": "alice", "reason": "deadline"}
    assert only(alice, "RESPONSE")["payload"]["code"] == "timeout"
    assert carol.take() == []
    assert router.conversations == {}
    assert router.addressed.pending == {}
    assert router.registry.get("bob").serving == 0
    assert router.registry.get("alice").open_requests == 0
    bob.to("alice", "RESPONSE", {"status": "success"}, conversation_id="k")
    assert bob.last()["payload"]["code"] == "unknown_conversation"


def test_cancel_of_an_addressed_request_stops_its_provider() -> None:
    _, router, alice, bob, _ = setup()
    call(alice, timeout_ms=None)
    bob.take()
    alice.send("CANCEL", {"reason": "changed my mind"}, conversation_id="k")
    assert only(bob, "CANCEL")["payload"] == {"requester_id": "alice", "reason": "changed my mind"}
    assert only(alice, "RESPONSE")["payload"]["code"] == "cancelled"
    assert router.conversations == {}
    assert router.addressed.pending == {}
    assert router.registry.get("bob").serving == 0


def test_a_failed_over_request_keeps_its_deadline_and_is_ended_at_its_new_provider() -> None:
    clock, router, alice, bob, carol = setup()
    call(alice)
    bob.take()
    clock.now += 2
    world.deliver(fail_over(router, bob, "close"))
    again = only(carol, "REQUEST")
    assert again["redelivered"] is True
    assert again["deadline"] == int(NOW * 1000) + 5000  # the same deadline, not a new one
    clock.now += 3.1
    world.deliver(router.tick())
    assert only(carol, "CANCEL")["payload"]["reason"] == "deadline"
    (timeout,) = alice.take()
    assert timeout["payload"]["code"] == "timeout"
    assert router.tick() == []  # ended once
    assert list(router.registry.get("bob").mailbox) == []  # nothing for the old provider


def test_a_cancel_after_a_failover_reaches_only_the_new_provider() -> None:
    _, router, alice, bob, carol = setup()
    call(alice, timeout_ms=None)
    bob.take()
    world.deliver(fail_over(router, bob, "close"))
    carol.take()
    alice.send("CANCEL", {}, conversation_id="k")
    assert only(carol, "CANCEL")["payload"]["reason"] == "cancelled"
    (cancelled,) = alice.take()
    assert cancelled["payload"]["code"] == "cancelled"
    assert list(router.registry.get("bob").mailbox) == []
    assert router.conversations == {}
