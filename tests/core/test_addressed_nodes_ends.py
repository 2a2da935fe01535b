"""A capability-addressed REQUEST decided on another cluster node, sans-I/O: its requester's
node keeps it open too (`Deadlines.passed_on`), so the requester's CANCEL and deadline are
answered there and reach the provider's node, its INPUT goes on to that node, and the final
RESPONSE that node decided, or a failover back, settles it (lobby/core/addressed.py). A REQUEST
goes to the node of a provider online there first (`Presence.elsewhere`)."""

from __future__ import annotations

from lobby.core import Router
from tests.core.test_addressed_nodes import Cluster, quote
from tests.core.test_shared_registry import join_shared as join
from tests.routerkit import Clock, Peer, world

NOW = Clock().now


def served_on_b(**envelope: object) -> tuple[Cluster, Router, Router, Peer, Peer]:
    """alice on node a; bob, who offers quote, on b; alice's REQUEST m-1 given to bob."""
    cluster = Cluster("a", "b")
    a, b = cluster.nodes["a"], cluster.nodes["b"]
    alice = join(a, "alice", acks=True)
    bob = join(b, "bob", capabilities=[quote()], acks=True)
    cluster.learn(alice, "a")
    cluster.learn(bob, "b", quote())
    alice.send(
        "REQUEST", {"capability_name": "quote"}, conversation_id="k", message_id="m-1", **envelope
    )
    cluster.carry()
    assert bob.last()["message_id"] == "m-1"
    return cluster, a, b, alice, bob


def test_a_cancel_is_answered_on_the_requesters_node_and_ends_it_on_the_providers() -> None:
    cluster, a, b, alice, bob = served_on_b(timeout_ms=60_000)
    alice.send("CANCEL", {}, conversation_id="k")
    answer = alice.last()
    assert (answer["sender_id"], answer["in_reply_to"]) == ("global_lobby", "m-1")
    assert answer["payload"]["code"] == "cancelled"
    cluster.carry()
    cancel = bob.last()
    assert (cancel["message_type"], cancel["in_reply_to"]) == ("CANCEL", "m-1")
    assert alice.take() == []  # answered once, by its own node
    assert a.requests.deadlines.open == b.requests.deadlines.open == {}
    assert a.requests.deadlines.elsewhere == set()
    assert b.conversations == {}
    assert b.addressed.pending == {}


def test_a_deadline_is_answered_on_the_requesters_node_and_cancelled_on_the_providers() -> None:
    cluster, a, b, alice, bob = served_on_b(timeout_ms=5000)
    for router in (a, b):
        clock = router.state.clock
        assert isinstance(clock, Clock)
        clock.now += 6
    world.deliver(a.tick() + b.tick())
    cluster.carry()
    (timeout,) = alice.take()
    assert (timeout["in_reply_to"], timeout["payload"]["code"]) == ("m-1", "timeout")
    (cancel,) = bob.take()
    assert (cancel["message_type"], cancel["payload"]["reason"]) == ("CANCEL", "deadline")
    assert a.requests.deadlines.open == b.requests.deadlines.open == {}


def test_input_goes_to_the_providers_node_and_the_final_response_settles_it() -> None:
    cluster, a, _, alice, bob = served_on_b(timeout_ms=60_000)
    ask = {"status": "in_progress", "input_required": {"question": "size?"}}
    bob.to("alice", "RESPONSE", ask, conversation_id="k")
    cluster.carry()
    assert alice.last()["payload"] == ask
    alice.to("bob", "INPUT", {"size": "M"}, conversation_id="k")
    cluster.carry()
    given = bob.last()
    assert (given["message_type"], given["payload"]) == ("INPUT", {"size": "M"})
    assert a.requests.deadlines.elsewhere == {("alice", "k", "m-1")}  # in progress: still open
    bob.to("alice", "RESPONSE", {"status": "success"}, conversation_id="k")
    cluster.carry()
    assert alice.last()["payload"] == {"status": "success"}
    assert a.requests.deadlines.open == {}
    assert a.requests.deadlines.elsewhere == set()
    alice.send("CANCEL", {}, conversation_id="k")
    assert alice.last()["payload"]["code"] == "unknown_conversation"
    alice.to("bob", "INPUT", {"size": "L"}, conversation_id="k")
    assert alice.last()["payload"]["code"] == "unknown_conversation"
    assert a.delivery.forwards == []  # refused on alice's node: nothing crosses


def test_a_failover_back_to_the_requesters_node_keeps_its_deadline() -> None:
    cluster, a, b, alice, bob = served_on_b(timeout_ms=5000)
    carol = join(a, "carol", capabilities=[quote()], acks=True)
    cluster.learn(carol, "a", quote())
    world.deliver(b.close(bob.session, 1006))  # b has nobody else: passed on to a
    cluster.carry()
    given = carol.last()
    assert (given["message_id"], given["deadline"]) == ("m-1", int(NOW * 1000) + 5000)
    assert a.requests.deadlines.elsewhere == set()  # decided on a now
    clock = a.state.clock
    assert isinstance(clock, Clock)
    clock.now += 6
    world.deliver(a.tick())
    timeout = alice.last()
    assert (timeout["in_reply_to"], timeout["payload"]["code"]) == ("m-1", "timeout")
    cancel = carol.last()
    assert (cancel["message_type"], cancel["in_reply_to"]) == ("CANCEL", "m-1")
    assert a.conversations == {}
    assert a.requests.deadlines.open == {}


def test_a_request_goes_to_the_node_of_a_provider_online_there() -> None:
    cluster = Cluster("a", "b", "c")
    a, b, c = (cluster.nodes[n] for n in "abc")
    alice = join(a, "alice", acks=True)
    early = join(b, "early", capabilities=[quote()], acks=True)
    late = join(c, "late", capabilities=[quote()], acks=True)
    cluster.learn(alice, "a")
    cluster.learn(early, "b", quote())
    cluster.learn(late, "c", quote())
    b.close(early.session)
    # Node c reports late online; b reports early offline. early is first in turn.
    world.deliver(a.presence_heard("c", [("late", True)]))
    world.deliver(a.presence_heard("b", [("early", True), ("early", False)]))
    alice.send("REQUEST", {"capability_name": "quote"}, conversation_id="k", message_id="m-1")
    cluster.carry()
    assert late.last()["message_id"] == "m-1"
    assert early.take() == []
    assert c.conversations == {("alice", "late", "k"): 1}


def test_no_provider_on_the_other_node_settles_it_on_the_requesters_node() -> None:
    cluster = Cluster("a", "b")
    a, b = cluster.nodes["a"], cluster.nodes["b"]
    alice = join(a, "alice", acks=True)
    bob = join(b, "bob", capabilities=[quote()], acks=True)
    cluster.learn(alice, "a")
    cluster.learn(bob, "b", quote())
    b.close(bob.session)
    alice.send(
        "REQUEST",
        {"capability_name": "quote"},
        conversation_id="k",
        message_id="m-1",
        timeout_ms=5000,
    )
    assert a.requests.deadlines.elsewhere == {("alice", "k", "m-1")}
    cluster.carry()
    answer = alice.last()
    assert (answer["in_reply_to"], answer["payload"]["code"]) == ("m-1", "no_provider")
    assert a.requests.deadlines.open == {}
    assert a.requests.deadlines.elsewhere == set()


def test_a_request_passed_on_to_a_third_node_keeps_its_deadline_there() -> None:
    cluster = Cluster("a", "b", "c")
    a, b, c = (cluster.nodes[n] for n in "abc")
    alice = join(a, "alice", acks=True)
    bob = join(b, "bob", capabilities=[quote()], acks=True)
    carl = join(c, "carl", capabilities=[quote()], acks=True)
    cluster.learn(alice, "a")
    cluster.learn(bob, "b", quote())
    cluster.learn(carl, "c", quote())
    alice.send(
        "REQUEST",
        {"capability_name": "quote"},
        conversation_id="k",
        message_id="m-1",
        timeout_ms=5000,
    )
    cluster.carry()
    assert bob.last()["message_id"] == "m-1"  # first in turn
    world.deliver(b.close(bob.session, 1006))  # nobody else on b: passed on to c
    cluster.carry()
    given = carl.last()
    assert (given["message_id"], given["redelivered"]) == ("m-1", True)
    assert given["deadline"] == int(NOW * 1000) + 5000
    for router in (a, c):
        clock = router.state.clock
        assert isinstance(clock, Clock)
        clock.now += 6
    world.deliver(a.tick() + c.tick())
    cluster.carry()
    timeout = alice.last()
    assert (timeout["in_reply_to"], timeout["payload"]["code"]) == ("m-1", "timeout")
    cancel = carl.last()
    assert (cancel["message_type"], cancel["payload"]["reason"]) == ("CANCEL", "deadline")
    assert c.conversations == {}
