"""A lobby node on a 3-server NATS cluster with `--cluster-replicas 3`: its journal, snapshots
and buckets are kept by all three servers, and the server leading the journal stream killed
while a sender streams REQUESTs loses nothing: every message arrives once, in order, after
JetStream elects another leader. Real `lobby nats` servers (docs/cluster.md's recipe), a real
`lobby serve --cluster` process, SDK agents."""

from __future__ import annotations

import asyncio
from pathlib import Path

from agent_sdk import Agent
from lobby.cluster.keys import AGENTS
from lobby.store.jetstream import SNAPSHOTS, STREAM, replicated
from tests.conftest import start_lobby_process
from tests.natskit import NatsServer, connect, nats_cluster, restart
from tests.test_durability import Collector, send_numbers, stop
from tests.waiting import until

MESSAGES = 300


STREAMS = (STREAM, f"OBJ_{SNAPSHOTS}", f"KV_{AGENTS}", "KV_nodes", "KV_recoveries")
"""The journal, the snapshots' object store and the buckets' streams the lobby makes."""


async def placement(
    server: NatsServer, streams: tuple[str, ...] = STREAMS
) -> dict[str, tuple[int, str | None]]:
    """Each stream: (its replicas, the server leading it)."""
    client = await connect(server.url)
    try:
        js = client.jetstream()
        found = {}
        for stream in streams:
            info = await js.stream_info(stream)
            leader = info.cluster.leader if info.cluster is not None else None
            found[stream] = (info.config.num_replicas or 1, leader)
        return found
    finally:
        await client.close()


async def test_a_killed_jetstream_leader_loses_no_message(tmp_path: Path) -> None:
    async with nats_cluster(tmp_path) as servers:
        urls = ",".join(server.url for server in servers)
        proc = start_lobby_process(
            tmp_path / "a", "--cluster", urls, "--node-id", "a", "--cluster-replicas", "3"
        )
        try:
            collector = Collector([proc.url])
            sender = Agent("sender", lobby_url=[proc.url], reconnect_max_delay=0.3)
            async with collector, sender:
                streams = await placement(servers[0])
                assert {replicas for replicas, _ in streams.values()} == {3}
                leader = streams[STREAM][1]
                assert leader in {"s0", "s1", "s2"}
                sending = asyncio.create_task(
                    send_numbers(sender, range(MESSAGES), to="collector", pause=0.002)
                )
                await until(lambda: len(collector.seen) >= 50)
                killed = servers[int(leader[1:])]
                killed.process.kill()
                await killed.process.wait()
                await sending
                await until(lambda: len(sender._dispatcher.outbound) == 0, "sender confirmed")
                await until(lambda: len(collector.seen) >= MESSAGES, "all collected")
                survivor = next(s for s in servers if s is not killed)
                replicas, new_leader = (await placement(survivor, (STREAM,)))[STREAM]
                assert (replicas, new_leader in {"s0", "s1", "s2"} - {leader}) == (3, True)
            assert collector.seen == list(range(MESSAGES))  # once each, in order
        finally:
            stop(proc)


async def test_streams_made_with_one_copy_are_given_the_count_a_node_starts_with(
    tmp_path: Path,
) -> None:
    """A deployment moving from one NATS server to three: streams and buckets that an earlier
    node made with one copy get the count `--cluster-replicas` asks for (`replicated`)."""
    async with nats_cluster(tmp_path) as servers:
        client = await connect(servers[0].url)
        try:
            js = client.jetstream()
            await js.add_stream(name=STREAM, subjects=["journal.*", "epoch.*"])
            await js.create_key_value(bucket=AGENTS, history=1)
            await js.create_object_store(SNAPSHOTS)
            made = (STREAM, f"KV_{AGENTS}", f"OBJ_{SNAPSHOTS}")
            assert {r for r, _ in (await placement(servers[0], made)).values()} == {1}
            for stream in made:
                await replicated(js, stream, 3)
                await replicated(js, stream, 3)  # already so: nothing to change
            assert {r for r, _ in (await placement(servers[0], made)).values()} == {3}
        finally:
            await client.close()


async def test_a_node_started_while_its_nats_cluster_forms_waits_for_it(tmp_path: Path) -> None:
    """Servers and lobby started together (a compose file, a reboot): a node asking for three
    copies while two of the three servers are down waits for them (JETSTREAM_NOT_READY) and
    starts once they are back, instead of failing its start."""
    async with nats_cluster(tmp_path) as servers:
        for server in servers[1:]:
            server.process.kill()
            await server.process.wait()
        urls = ",".join(server.url for server in servers)
        data = tmp_path / "a"
        starting = asyncio.create_task(
            asyncio.to_thread(
                start_lobby_process,
                data,
                *("--cluster", urls, "--node-id", "a", "--cluster-replicas", "3"),
                timeout=60,
            )
        )

        def waiting() -> bool:
            return any("JETSTREAM_NOT_READY" in log.read_text() for log in data.glob("*.log"))

        await until(waiting, "the node waits for the cluster")
        assert not starting.done()
        for server in servers[1:]:
            await restart(server)
        proc = await starting
        try:
            streams = await placement(servers[0], (STREAM, f"OBJ_{SNAPSHOTS}"))
            assert {replicas for replicas, _ in streams.values()} == {3}
            async with Agent("early", lobby_url=[proc.url]) as agent:
                assert await agent.discover("nothing") == []
        finally:
            stop(proc)
