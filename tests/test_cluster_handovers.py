"""Handovers between two live nodes' cores (`lobby.cluster.handovers`), each over its own real
NATS connection to a real `nats-server -js`: a handover too large for one NATS message goes
through the object store, and the old home journals the agent as given up only once the new
node confirms its adoption."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
from nats.js.errors import NotFoundError

from lobby.cluster import handovers
from lobby.cluster.handovers import Handovers
from lobby.core.records import Acked
from tests.core.test_shared_registry import join_shared
from tests.natskit import connect, nats_server
from tests.routerkit import make_router
from tests.test_cluster_relay import execute, learns
from tests.waiting import until


async def test_a_handover_too_large_for_one_nats_message_goes_through_the_object_store(
    tmp_path: Path,
) -> None:
    """Bob's mailbox on a holds 1.2 MB: more than NATS takes in one message (1 MiB). Once b
    says it adopted bob, a journals him as given up."""
    a, b = make_router(), make_router()
    a.share("a")
    b.share("b")
    alice, _ = join_shared(a, "alice", acks=True), join_shared(a, "bob", acks=True)
    for n in range(12):
        alice.to("bob", "TEXT", {"content": "x" * 100_000}, message_id=f"m{n}")
    learns(b, "bob", a, "a")
    a.take_journal()
    async with nats_server(tmp_path) as nats:
        nc_a, nc_b = await connect(nats.url), await connect(nats.url)
        on_a = Handovers("a", a, execute, lambda then: then())
        on_b = Handovers("b", b, execute, lambda then: then())
        try:
            await on_a.start(nc_a)
            await on_b.start(nc_b)
            data = await on_b.ask_release("a", "bob")
            assert data is not None
            assert [m[3] for m in orjson.loads(data)["messages"]] == [f"m{n}" for n in range(12)]
            store = await nc_b.jetstream().object_store(handovers.HANDOVERS)
            with pytest.raises(NotFoundError):  # fetched, then deleted: none left
                await store.list(ignore_deletes=True)
            assert b.handed_over("a", "bob", data) == []  # adopted; no resume waited for it
            assert [seq for seq, _ in b.registry.agents["bob"].mailbox] == list(range(1, 13))
            assert a.take_journal().records == []  # given up, not yet journaled so
            on_b.adopted("a", "bob")
            await until(lambda: not a.given_up, "a heard that b adopted bob")
            assert Acked("bob", 12) in a.take_journal().records
        finally:
            await on_a.stop()
            await on_b.stop()
            await nc_a.close()
            await nc_b.close()
