"""`lobby serve --cluster ... --node-id ...`: a real lobby node process whose durable state lives
in a real `nats-server -js`, across SIGKILL, compaction, a second process claiming its node id,
bad settings and an unreachable NATS."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Awaitable, Callable
from pathlib import Path

import orjson
import pytest
from nats.js.errors import NotFoundError

from agent_sdk import Agent
from lobby.store.jetstream import SNAPSHOTS, STREAM
from tests.conftest import LobbyProcess, start_lobby_process
from tests.natskit import NatsServer, connect, free_port, nats_server
from tests.test_cli import lobby_cli, one_line
from tests.test_durability import Collector, send_numbers, stop
from tests.test_metrics import http_get
from tests.waiting import until, wait_until


def node(
    data_dir: Path, nats: NatsServer, node_id: str = "n1", *extra: str, port: int = 0
) -> LobbyProcess:
    """A lobby node; agents keep their tokens per lobby address: a restart keeps its port."""
    return start_lobby_process(
        data_dir, "--cluster", nats.url, "--node-id", node_id, *extra, port=port
    )


def killed_and_restarted(proc: LobbyProcess, data_dir: Path, nats: NatsServer) -> LobbyProcess:
    proc.signal(signal.SIGKILL)
    proc.wait(10)
    return node(data_dir, nats, port=proc.port)


async def journal_and_snapshots(nats: NatsServer, node_id: str) -> tuple[int, int]:
    """How many journal messages and snapshots NATS holds for `node_id`."""
    client = await connect(nats.url)
    try:
        js = client.jetstream()
        subject = f"journal.{node_id}"
        info = await js.stream_info(STREAM, subjects_filter=subject)
        try:
            objects = await (await js.object_store(SNAPSHOTS)).list(ignore_deletes=True)
        except NotFoundError:  # none yet
            objects = []
        named = [o for o in objects if o.name.startswith(f"{node_id}.")]
        return (info.state.subjects or {}).get(subject, 0), len(named)
    finally:
        await client.close()


async def test_a_node_killed_and_restarted_loses_and_duplicates_nothing(tmp_path: Path) -> None:
    data = tmp_path / "data"
    async with nats_server(tmp_path) as nats:
        lobby = node(data, nats)
        try:
            collector = Collector(lobby.url)
            async with collector:
                pass  # registered, then offline: the node holds what is sent to it
            sender = Agent("sender", lobby_url=lobby.url)
            async with sender:
                await send_numbers(sender, range(300))
                await until(lambda: len(sender._dispatcher.outbound) == 0)  # all ACCEPTED
            lobby = killed_and_restarted(lobby, data, nats)
            collector = Collector(lobby.url)
            sender = Agent("sender", lobby_url=lobby.url)
            async with collector, sender:
                await until(lambda: len(collector.seen) >= 300)
                await send_numbers(sender, range(300, 301))  # arrives behind any repeat
                await until(lambda: 300 in collector.seen)
            assert collector.seen == list(range(301))
            assert collector.stats.resumes == 1  # the restarted node still knew its token
            assert sender.stats.resumes == 1
        finally:
            stop(lobby)


async def test_after_compaction_a_restart_reads_the_snapshot_and_what_followed(
    tmp_path: Path,
) -> None:
    data = tmp_path / "data"
    async with nats_server(tmp_path) as nats:
        lobby = node(data, nats, "n1", "--compact-interval", "0.2")
        try:
            collector = Collector(lobby.url)
            async with collector:
                pass
            async with Agent("sender", lobby_url=lobby.url) as sender:
                await send_numbers(sender, range(100))
                await until(lambda: len(sender._dispatcher.outbound) == 0)
            # Everything committed has gone into a snapshot and out of the journal.
            await until_async(lambda: journal_and_snapshots(nats, "n1"), (0, 1))
            lobby = killed_and_restarted(lobby, data, nats)
            async with Agent("sender", lobby_url=lobby.url) as sender:
                await send_numbers(sender, range(100, 150))  # into the journal after it
                await until(lambda: len(sender._dispatcher.outbound) == 0)
            lobby = killed_and_restarted(lobby, data, nats)
            collector = Collector(lobby.url)
            async with collector, Agent("sender", lobby_url=lobby.url) as sender:
                await until(lambda: len(collector.seen) >= 150)
                await send_numbers(sender, range(150, 151))
                await until(lambda: 150 in collector.seen)
            assert collector.seen == list(range(151))
        finally:
            stop(lobby)


async def until_async(probe: Callable[[], Awaitable[object]], expected: object) -> None:
    """Wait until `await probe()` returns `expected`."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 30
    while (got := await probe()) != expected:
        assert loop.time() < deadline, f"still {got}, waiting for {expected}"
        await asyncio.sleep(0.05)


async def test_a_second_process_with_the_same_node_id_fences_the_first(tmp_path: Path) -> None:
    async with nats_server(tmp_path) as nats:
        first = node(tmp_path / "first", nats)
        second: LobbyProcess | None = None
        try:
            collector = Collector(first.url)
            sender = Agent("sender", lobby_url=first.url)
            async with collector, sender:
                await until_async(lambda: committed_records(first), 2)  # both registrations
                second = node(tmp_path / "second", nats)
                await send_numbers(sender, range(1))
                await until(lambda: collector.seen == [0])  # delivery does not wait for commits
                wait_until(
                    lambda: any(e["event"] == "STORE_WRITE_FAILED" for e in first.events()),
                    "the first node's commit to fail",
                )
                # Nothing committed, so nothing confirmed: the message waits to be resent.
                assert len(sender._dispatcher.outbound) == 1
                status, _, body = await http_get(f"http://127.0.0.1:{first.port}/readyz")
                assert status == 503
                assert "another process claimed node id 'n1'" in orjson.loads(body)["reason"]
                assert first.process.poll() is None  # it keeps running, confirming nothing
            # The second node knows the agents the first registered before it was fenced.
            again = Agent("sender", lobby_url=second.url)
            again._sender.token = sender._sender.token  # tokens are saved per lobby address
            async with again:
                assert again.stats.resumes == 1
        finally:
            stop(first)
            if second is not None:
                stop(second)


async def committed_records(proc: LobbyProcess) -> object:
    _, _, body = await http_get(f"http://127.0.0.1:{proc.port}/healthz")
    return orjson.loads(body)["store"]["records"]


@pytest.mark.parametrize(
    ("args", "env", "names"),
    [
        (["--cluster", "http://127.0.0.1:4222", "--node-id", "n1"], {}, "--cluster"),
        (["--cluster", "nats://127.0.0.1:4222,localhost:1", "--node-id", "n1"], {}, "--cluster"),
        (["--cluster", "nats://127.0.0.1:4222"], {}, "needs --node-id"),
        (["--cluster", "nats://127.0.0.1:4222", "--node-id", "a.b"], {}, "--node-id a.b"),
        (["--node-id", "n1"], {}, "only with --cluster"),
        (["--cluster-replicas", "3"], {}, "--cluster-replicas 3"),
        (
            ["--cluster", "nats://h:1", "--node-id", "n1", "--cluster-replicas", "7"],
            {},
            "at most 5",
        ),
        ([], {"LOBBY_CLUSTER_REPLICAS": "0"}, "LOBBY_CLUSTER_REPLICAS="),
        ([], {"LOBBY_CLUSTER": "nats://h:1", "LOBBY_NODE_ID": "x" * 65}, "LOBBY_NODE_ID="),
        (["--cluster", "tls://h:1", "--node-id", "n1", "--store", "memory"], {}, "--store"),
    ],
)
def test_a_bad_cluster_setting_is_one_line_exit_2(
    tmp_path: Path, args: list[str], env: dict[str, str], names: str
) -> None:
    done = lobby_cli("serve", "--data-dir", "data", *args, cwd=tmp_path, env=env)
    assert done.returncode == 2
    assert names in one_line(done)
    assert list(tmp_path.iterdir()) == []


def test_an_unreachable_nats_at_start_is_one_line_exit_1(tmp_path: Path) -> None:
    url = f"nats://127.0.0.1:{free_port()}"
    done = lobby_cli("serve", "--cluster", url, "--node-id", "n1", cwd=tmp_path)
    assert done.returncode == 1
    assert one_line(done) == f"lobby: cannot reach NATS at {url}: no server answered"
