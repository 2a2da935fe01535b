"""Capability-addressed REQUESTs between two cluster nodes, sans-I/O: the forwards each node
queues are carried by hand to the other (`Router.relayed` for those it routes as its own,
`Router.decided` for those already decided), as `lobby.cluster.routing` carries them over NATS
(lobby/core/addressed.py, "other nodes")."""

from __future__ import annotations

from typing import Any

import orjson

from lobby.core import Router, Session
from lobby.core.records import AgentSaved
from lobby.core.refusal import hash_token
from tests.core.test_shared_registry import join_shared as join
from tests.routerkit import Peer, cap, make_router, world


class Cluster:
    """Nodes by id, and relay sessions by (node, sender): what carries one node's forwards to
    another."""

    def __init__(self, *node_ids: str) -> None:
        self.nodes: dict[str, Router] = {}
        for node_id in node_ids:
            router = make_router()
            router.share(node_id)
            self.nodes[node_id] = router
        self.relays: dict[tuple[str, str, str], Session] = {}

    def learn(self, peer: Peer, home: str, *capabilities: dict[str, Any]) -> None:
        """Every other node learns `peer`, connected to `home`, and what it offers."""
        saved = AgentSaved(peer.agent_id, hash_token(peer.token), orjson.dumps(capabilities), True)
        for node_id, router in self.nodes.items():
            if node_id != home:
                router.learned(saved, home)

    def carry(self) -> int:
        """Hand every queued forward to its node (until none is left); how many were."""
        carried = 0
        while True:
            moving = [(n, f) for n, r in self.nodes.items() for f in r.delivery.forwards]
            if not moving:
                return carried
            for router in self.nodes.values():
                router.delivery.forwards = []
            for origin, (home, _, sender, _, frame, decided) in moving:
                carried += 1
                target = self.nodes[home]
                session = self._relay(home, origin, sender)
                if decided and sender == "global_lobby":
                    actions = target.decided(None, frame) or []
                elif decided:
                    actions = target.decided(session, frame) or []
                else:
                    actions = target.relayed(session, frame)
                world.deliver(actions)

    def _relay(self, home: str, origin: str, sender: str) -> Session:
        key = (home, origin, sender)
        session = self.relays.get(key)
        if session is None:
            router = self.nodes[home]
            session = self.relays[key] = router.open(f"node {origin}")
            session.agent = router.registry.get(sender)
        return session


def quote() -> dict[str, Any]:
    return cap("quote")


def test_a_requester_on_one_node_is_served_by_a_provider_on_the_other() -> None:
    cluster = Cluster("a", "b")
    a, b = cluster.nodes["a"], cluster.nodes["b"]
    alice = join(a, "alice", acks=True)
    bob = join(b, "bob", capabilities=[quote()], acks=True)
    cluster.learn(alice, "a")
    cluster.learn(bob, "b", quote())
    alice.send(
        "REQUEST",
        {"capability_name": "quote", "arguments": {"n": 1}},
        conversation_id="k",
        message_id="m-1",
    )
    assert alice.take() == []
    assert cluster.carry() == 1
    (delivered,) = bob.take()
    assert (delivered["sender_id"], delivered["receiver_id"], delivered["message_id"]) == (
        "alice",
        "bob",
        "m-1",
    )
    assert delivered["payload"] == {"capability_name": "quote", "n": 1}
    assert b.conversations == {("alice", "bob", "k"): 1}
    assert a.conversations == {}  # decided on b, where it was dispatched
    bob.to("alice", "RESPONSE", {"status": "in_progress"}, conversation_id="k")
    bob.to("alice", "RESPONSE", {"status": "success", "price": 4}, conversation_id="k")
    assert cluster.carry() == 2
    answers = alice.take()
    assert [(r["sender_id"], r["payload"]["status"]) for r in answers] == [
        ("bob", "in_progress"),
        ("bob", "success"),
    ]
    assert b.conversations == {}
    assert b.addressed.pending == {}


def test_no_provider_on_the_other_node_is_answered_to_the_requester() -> None:
    cluster = Cluster("a", "b")
    a, b = cluster.nodes["a"], cluster.nodes["b"]
    alice = join(a, "alice", acks=True)
    bob = join(b, "bob", capabilities=[quote()])
    cluster.learn(alice, "a")
    cluster.learn(bob, "b", quote())
    b.close(bob.session)  # gone from b; a does not know (the shared registry holds its home)
    alice.send("REQUEST", {"capability_name": "quote"}, conversation_id="k")
    cluster.carry()
    (answer,) = alice.take()
    assert (answer["sender_id"], answer["payload"]["code"]) == ("global_lobby", "no_provider")
    assert answer["payload"]["error"] == "no online agent offers capability 'quote' to 'alice'"


def test_a_provider_gone_on_one_node_fails_over_to_one_on_the_other() -> None:
    cluster = Cluster("a", "b")
    a, b = cluster.nodes["a"], cluster.nodes["b"]
    alice = join(a, "alice", acks=True)
    bob = join(b, "bob", capabilities=[quote()], acks=True)
    carol = join(a, "carol", capabilities=[quote()], acks=True)
    cluster.learn(alice, "a")
    cluster.learn(bob, "b", quote())
    cluster.learn(carol, "a", quote())
    # carol is offline: alice's goes to b, where bob is connected.
    a.close(carol.session)
    alice.send("REQUEST", {"capability_name": "quote"}, conversation_id="k", message_id="m-1")
    cluster.carry()
    assert bob.take()[0]["message_id"] == "m-1"
    again = join(a, "carol_too", capabilities=[quote()], acks=True)
    cluster.learn(again, "a", quote())
    world.deliver(b.close(bob.session, 1006))  # b has nobody else: passed on to a
    assert cluster.carry() == 1
    (redelivered,) = again.take()
    assert (redelivered["message_id"], redelivered["redelivered"]) == ("m-1", True)
    assert b.conversations == {}
    assert a.conversations == {("alice", "carol_too", "k"): 1}
    again.to("alice", "RESPONSE", {"status": "success"}, conversation_id="k")
    assert alice.take()[0]["sender_id"] == "carol_too"
    assert a.conversations == {}
