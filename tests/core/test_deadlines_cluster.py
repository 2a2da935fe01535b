"""Deadlines and CANCEL between cluster nodes, sans-I/O (lobby/core/deadlines.py): the
requester's node answers the requester, the provider's home withdraws its copy and CANCELs the
provider; a CANCEL is routed again by the provider's home, a deadline passes on both."""

from __future__ import annotations

from typing import Any

import orjson

from lobby.core import Router
from lobby.core.session import Send, Session
from protocol.models import LOBBY_ID
from tests.core.test_forwarding import learn
from tests.core.test_shared_registry import join_shared as join
from tests.routerkit import Clock, Peer, cap, make_router, world

NOW = 1_700_000_000.0


def nodes() -> tuple[Clock, Router, Router, Peer, Peer, Session]:
    """alice on node a, bob (capability c) on node b, and b's session standing for alice."""
    clock = Clock(NOW)
    a, b = make_router(clock), make_router(clock)
    a.share("a")
    b.share("b")
    alice = join(a, "alice", acks=True)
    bob = join(b, "bob", acks=True, capabilities=[cap("c")])
    learn(a, "bob", "b", cap("c"))
    learn(b, "alice", "a")
    relay = b.open("node a")
    relay.agent = b.registry.get("alice")
    return clock, a, b, alice, bob, relay


def carry(a: Router, b: Router, relay: Session) -> list[dict[str, Any]]:
    """Route on b what a forwarded to it, as b's cluster layer does; what b sends back to
    the relay session (alice's node)."""
    back: list[Any] = []
    for home, _, sender, _, frame, decided in a.delivery.forwards:
        assert home == "b"
        if decided:
            actions = b.decided(None if sender == LOBBY_ID else relay, frame) or []
        else:
            actions = b.relayed(relay, frame)
        world.deliver(actions)
        back += [a for a in actions if isinstance(a, Send) and a.session is relay]
    a.delivery.forwards.clear()
    return [orjson.loads(s.frame) for s in back]


def request(alice: Peer, **envelope: Any) -> None:
    alice.to(
        "bob", "REQUEST", {"capability_name": "c"}, conversation_id="k", message_id="m1", **envelope
    )


def test_a_cancel_for_a_provider_on_another_node_is_routed_again_by_its_home() -> None:
    _, a, b, alice, bob, relay = nodes()
    request(alice)
    carry(a, b, relay)
    assert bob.last()["message_type"] == "REQUEST"
    alice.send("CANCEL", {"reason": "no more"}, conversation_id="k")
    answer = alice.last()
    assert (answer["sender_id"], answer["payload"]["code"]) == ("global_lobby", "cancelled")
    assert carry(a, b, relay) == []  # no ERROR back: b had it open too
    cancel = bob.last()
    assert (cancel["message_type"], cancel["in_reply_to"]) == ("CANCEL", "m1")
    assert cancel["payload"] == {"requester_id": "alice", "reason": "no more"}
    assert a.conversations == b.conversations == {}
    assert alice.take() == []  # once, from alice's own node


def test_a_deadline_between_nodes_answers_once_and_cancels_once() -> None:
    clock, a, b, alice, bob, relay = nodes()
    request(alice, timeout_ms=5000)
    carry(a, b, relay)
    assert bob.last()["deadline"] == int(NOW * 1000) + 5000
    clock.now += 6
    world.deliver(a.tick())
    assert a.delivery.forwards == []  # the provider's side is its home's
    world.deliver(b.tick())
    assert b.delivery.forwards == []  # the requester's side is its home's
    (timeout,) = alice.take()
    assert timeout["payload"]["code"] == "timeout"
    (cancel,) = bob.take()
    assert (cancel["message_type"], cancel["payload"]["reason"]) == ("CANCEL", "deadline")
    assert a.conversations == b.conversations == {}


def test_a_request_held_on_the_providers_home_is_dropped_there_at_its_deadline() -> None:
    clock, a, b, alice, bob, relay = nodes()
    b.close(bob.session)
    request(alice, timeout_ms=1000)
    carry(a, b, relay)
    assert len(b.registry.agents["bob"].mailbox) == 1
    clock.now += 2
    world.deliver(a.tick() + b.tick())
    assert alice.last()["payload"]["code"] == "timeout"
    assert list(b.registry.agents["bob"].mailbox) == []
    assert bob.take() == []
