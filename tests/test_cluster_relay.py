"""Two nodes' relays (`lobby.cluster.routing.Relay`) in this process, each over its own real
NATS connection to a real `nats-server -js`, each with its own core: what node a forwards while
node b is not listening (core NATS drops it, as it may drop any message) is sent again once it
has gone unconfirmed for `RESEND_AFTER`, and reaches its receiver on b once."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from nats.aio.client import Client

from lobby.cluster import routing
from lobby.cluster.relayed import NodeLink
from lobby.cluster.routing import Relay
from lobby.core import Router, Send
from lobby.core.records import AgentSaved
from lobby.core.session import Action
from tests.core.test_shared_registry import join_shared
from tests.natskit import connect, nats_server
from tests.routerkit import Peer, make_router, world
from tests.waiting import until


def execute(actions: Iterable[Action]) -> None:
    """As the server does: a frame for a relay session goes to its node's link, the rest to
    the agents' inboxes."""
    for action in actions:
        if isinstance(action, Send) and isinstance(action.session.link, NodeLink):
            action.session.link.put(action.frame)
        else:
            world.deliver([action])


def learns(router: Router, agent_id: str, router_there: Router, home: str) -> None:
    """`router` learns `agent_id`, registered on `router_there`, whose node is `home`."""
    record = router_there.registry.get(agent_id)
    assert record is not None
    router.learned(AgentSaved(agent_id, record.token_hash, b"[]", True), home)


def alice_on_a_bob_on_b() -> tuple[Router, Router, Peer, Peer]:
    """Nodes a and b, alice (acknowledging) on a and bob on b, each known to the other."""
    a, b = make_router(), make_router()
    a.share("a")
    b.share("b")
    alice, bob = join_shared(a, "alice", acks=True), join_shared(b, "bob")
    learns(a, "bob", b, "b")
    learns(b, "alice", a, "a")
    return a, b, alice, bob


async def published(relay: Relay) -> None:
    """Until the relay's publishes are handed to its NATS connection (they run as tasks: a
    flush before them would not cover them)."""
    while relay._tasks:
        await asyncio.gather(*relay._tasks)


@asynccontextmanager
async def relays(
    tmp_path: Path, a: Router, b: Router
) -> AsyncIterator[tuple[Relay, Relay, Client, Client]]:
    """Node a's and node b's relays, not started, each on its own connection to one real
    `nats-server -js`; stopped and disconnected at the end."""
    async with nats_server(tmp_path) as nats:
        nc_a, nc_b = await connect(nats.url), await connect(nats.url)
        relay_a = Relay("a", a, execute, lambda then: then())
        relay_b = Relay("b", b, execute, lambda then: then())
        try:
            yield relay_a, relay_b, nc_a, nc_b
        finally:
            await relay_a.stop()
            await relay_b.stop()
            await nc_a.close()
            await nc_b.close()


async def test_a_forward_nobody_heard_is_sent_again_and_delivered_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(routing, "RESEND_AFTER", 0.5)
    a, b, alice, bob = alice_on_a_bob_on_b()
    async with relays(tmp_path, a, b) as (relay_a, relay_b, nc_a, nc_b):
        await relay_a.start(nc_a)
        alice.to("bob", "TEXT", {"content": "lost once"}, message_id="m1")
        relay_a.kick()  # published to lobby.fwd.b, which nobody reads yet
        await published(relay_a)
        await nc_a.flush()
        assert relay_a.links["b"].kept
        await relay_b.start(nc_b)
        await nc_b.flush()
        await until(lambda: bob.inbox, "bob got the resend")
        await until(lambda: not relay_a.links["b"].kept, "b confirmed it")
        execute(b.committed(b.take_journal()))  # b's commit: ACCEPTED goes back to a
        relay_b.kick()
        await until(lambda: alice.inbox, "alice got ACCEPTED")
        (text,) = bob.take()
        assert (text["sender_id"], text["payload"], text["seq"]) == (
            "alice",
            {"content": "lost once"},
            1,
        )
        accepted = [f for f in alice.take() if f["message_type"] == "ACCEPTED"]
        assert [f["payload"]["message_id"] for f in accepted] == ["m1"]
        assert relay_a.resent == 1
        await asyncio.sleep(2 * routing.RESEND_AFTER + 1.0)  # confirmed: never again
        assert bob.take() == []
        assert relay_a.resent == 1
        relay_a.unanswered(time.monotonic())
        assert not relay_a.links["b"].sent  # what it remembers of batches sent: nothing kept


async def test_a_forward_left_out_is_kept_past_later_confirmations_until_its_receiver_moves(
    tmp_path: Path,
) -> None:
    """b leaves out a's message to bob (bob's home is c now, as b has learned), then confirms
    a's next batch: a still keeps the first, and sends it to c once it learns bob is there."""
    a, b = make_router(), make_router()
    a.share("a")
    b.share("b")
    alice = join_shared(a, "alice", acks=True)
    join_shared(b, "bob")
    carol = join_shared(b, "carol")
    for name in ("bob", "carol"):
        learns(a, name, b, "b")
    learns(b, "alice", a, "a")
    learns(b, "bob", b, "c")  # bob resumed on c: b knows, a not yet
    async with relays(tmp_path, a, b) as (relay_a, relay_b, nc_a, nc_b):
        await relay_a.start(nc_a)
        await relay_b.start(nc_b)
        alice.to("bob", "TEXT", {"content": "to bob"}, message_id="m1")
        relay_a.kick()
        await until(lambda: relay_a.links["b"].left_out, "b left m1 out")
        alice.to("carol", "TEXT", {"content": "to carol"}, message_id="m2")
        relay_a.kick()
        await until(lambda: carol.inbox, "carol got m2")
        kept = relay_a.links["b"].kept
        await until(lambda: all(e.message_id != "m2" for e in kept), "b confirmed m2")
        assert [e.message_id for e in relay_a.links["b"].kept] == ["m1"]
        relay_a.rehome("bob", "b", "c")
        assert [(f[0], f[3]) for f in a.delivery.forwards] == [("c", "m1")]


async def test_a_batch_core_nats_dropped_is_asked_for_and_routed_before_what_followed_it(
    tmp_path: Path,
) -> None:
    """Of a's three batches to b, the second never arrives: b routes the first, refuses the
    third (a gap), asks a for everything from the second, and bob gets all three in order."""
    a, b, alice, bob = alice_on_a_bob_on_b()
    async with relays(tmp_path, a, b) as (relay_a, relay_b, nc_a, nc_b):
        await relay_a.start(nc_a)
        await relay_b.start(nc_b)
        for n in (1, 2, 3):
            alice.to("bob", "TEXT", {"content": f"m{n}"}, message_id=f"m{n}")
            if n == 2:
                lost = relay_a._nc
                relay_a._nc = None  # this publish goes nowhere, as in a NATS outage
                relay_a.kick()
                relay_a._nc = lost
            else:
                relay_a.kick()
            await nc_a.flush()
        await until(lambda: len(bob.inbox) == 3, "bob got all three")
        assert [f["payload"]["content"] for f in bob.take()] == ["m1", "m2", "m3"]
        await until(lambda: not relay_a.links["b"].kept, "b confirmed all three")
        assert relay_a.resent >= 2  # batches 2 and 3, at b's request, not after RESEND_AFTER


async def test_a_sender_the_home_has_not_learned_is_read_and_its_messages_keep_their_place(
    tmp_path: Path,
) -> None:
    """b has not learned alice when her messages arrive, nor carol's behind them: b reads
    alice's entry, then routes hers and carol's in order; nothing is left out."""
    a, b = make_router(), make_router()
    a.share("a")
    b.share("b")
    alice, carol = join_shared(a, "alice", acks=True), join_shared(a, "carol", acks=True)
    bob = join_shared(b, "bob")
    learns(a, "bob", b, "b")
    learns(b, "carol", a, "a")
    read: list[str] = []

    async def learn(agent_id: str) -> None:
        await asyncio.sleep(0.2)  # a registry read that takes a while: carol's batch waits
        read.append(agent_id)
        learns(b, agent_id, a, "a")

    async with relays(tmp_path, a, b) as (relay_a, relay_b, nc_a, nc_b):
        relay_b.learn = learn
        await relay_a.start(nc_a)
        await relay_b.start(nc_b)
        alice.to("bob", "TEXT", {"content": "alice 1"}, message_id="a1")
        alice.to("bob", "TEXT", {"content": "alice 2"}, message_id="a2")
        relay_a.kick()
        carol.to("bob", "TEXT", {"content": "carol 1"}, message_id="c1")
        relay_a.kick()
        await until(lambda: len(bob.inbox) == 3, "bob got all three")
        assert [f["payload"]["content"] for f in bob.take()] == ["alice 1", "alice 2", "carol 1"]
        assert read == ["alice"]
        await until(lambda: not relay_a.links["b"].kept, "b confirmed them")
        assert not relay_a.links["b"].left_out
