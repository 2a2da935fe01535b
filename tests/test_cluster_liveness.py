"""A node is failed over only when it is dead, and a node that was failed over while alive
steps down and rejoins: real `nats-server -js`, real `lobby serve --cluster` processes, SDK
agents. Each fault is repeated `ROUNDS` times in one test; kill and resume points come from
log events and probes (/readyz, /healthz)."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path

import orjson
import pytest
import websockets.exceptions

from agent_sdk import Agent
from lobby.server import LobbyServer
from lobby.transport import memory
from tests.conftest import LobbyProcess
from tests.natskit import NatsServer, nats_server, restart
from tests.test_cluster_failover import agents_known
from tests.test_cluster_node import node
from tests.test_cluster_registry import WAIT, agent, healthz
from tests.test_durability import Collector, send_numbers, stop
from tests.test_metrics import http_get
from tests.waiting import until
from tests.wsclient import frame, reply, serving

ROUNDS = 3
DEAD_AFTER = "3.5"
"""`--cluster-dead-after` here: short, to keep each round short; still past NODE_TTL (3 s)."""


def cluster_node(tmp_path: Path, nats: NatsServer, node_id: str) -> LobbyProcess:
    return node(tmp_path / node_id, nats, node_id, "--cluster-dead-after", DEAD_AFTER)


def count(proc: LobbyProcess, event: str, node_id: str | None = None) -> int:
    return sum(
        1
        for e in proc.events()
        if e.get("event") == event and (node_id is None or e.get("node_id") == node_id)
    )


async def until_logged(
    proc: LobbyProcess, event: str, times: int, node_id: str | None = None
) -> None:
    """Until `proc` has logged `event` (about `node_id`) `times` times."""
    await until(lambda: count(proc, event, node_id) >= times, f"{event} x{times}", limit=WAIT)


def both_have(first: Collector, second: Collector, n: int) -> bool:
    return n in first.seen and n in second.seen


def holds(collector: Collector, numbers: list[int]) -> bool:
    return collector.seen == numbers


async def readyz(proc: LobbyProcess) -> int:
    try:
        status, _, _ = await http_get(f"http://127.0.0.1:{proc.port}/readyz")
    except OSError:
        return 0  # not listening (between two incarnations)
    return status


async def until_ready(*procs: LobbyProcess) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + WAIT
    for proc in procs:
        while (status := await readyz(proc)) != 200:
            assert loop.time() < deadline, f"{proc.url} /readyz still {status}"
            await asyncio.sleep(0.1)


@contextmanager
def paused(proc: LobbyProcess) -> Iterator[None]:
    proc.signal(signal.SIGSTOP)
    try:
        yield
    finally:
        proc.signal(signal.SIGCONT)


async def test_a_nats_restart_fails_no_node_over(tmp_path: Path) -> None:
    """The only nats-server SIGKILLed and back 3 s later, three times: every node's key
    expired meanwhile, yet nobody is recovered, both nodes are ready again and their agents
    still reach each other."""
    async with nats_server(tmp_path) as nats:
        a, b = cluster_node(tmp_path, nats, "a"), cluster_node(tmp_path, nats, "b")
        try:
            on_a = Collector([a.url], agent_id="collector-a")
            on_b = Collector([b.url], agent_id="collector-b")
            sender_a = Agent("sender-a", lobby_url=[a.url], reconnect_max_delay=0.3)
            sender_b = Agent("sender-b", lobby_url=[b.url], reconnect_max_delay=0.3)
            async with on_a, on_b, sender_a, sender_b:
                async with asyncio.timeout(WAIT):
                    while await agents_known(a, b) != [4, 4]:
                        await asyncio.sleep(0.05)
                for n in range(ROUNDS):
                    nats.process.kill()
                    await asyncio.sleep(3.0)  # the outage: a parameter of the scenario
                    await restart(nats)
                    await until_ready(a, b)
                    await send_numbers(sender_a, range(n, n + 1), to="collector-b")
                    await send_numbers(sender_b, range(n, n + 1), to="collector-a")
                    await until(partial(both_have, on_a, on_b, n), f"round {n}")
                # Past the dead window after the last restart: still nobody failed over.
                await asyncio.sleep(float(DEAD_AFTER) + 1.5)
                for proc in (a, b):
                    health = await healthz(proc)
                    assert health["recovered"] == {}
                    assert health["nodes"] == ["a", "b"]
                    assert count(proc, "CLUSTER_RECOVERY_STARTED") == 0
                    assert count(proc, "CLUSTER_FENCED") == 0
                assert await readyz(a) == await readyz(b) == 200
            assert on_a.seen == on_b.seen == list(range(ROUNDS))
        finally:
            stop(a)
            stop(b)


async def test_a_paused_node_failed_over_steps_down_and_rejoins(tmp_path: Path) -> None:
    """Node a paused (SIGSTOP) past the dead window, three times: b fails it over; on SIGCONT
    a closes its agents' connections with 1012, rejoins under a new epoch, and its former
    agents (SDK agents given both addresses) are served on b."""
    async with nats_server(tmp_path) as nats:
        a, b = cluster_node(tmp_path, nats, "a"), cluster_node(tmp_path, nats, "b")
        try:
            sender = Agent("sender", lobby_url=[b.url], reconnect_max_delay=0.3)
            async with sender:
                for n in range(ROUNDS):
                    worker = Collector([a.url, b.url], agent_id=f"worker-{n}")
                    async with worker, agent(a, f"raw-{n}") as raw:
                        await until_known(b, 1 + 2 * (n + 1))  # the sender, 2 per round
                        with paused(a):
                            await until_logged(b, "CLUSTER_NODE_RECOVERED", n + 1, "a")
                        with pytest.raises(websockets.exceptions.ConnectionClosed):
                            await asyncio.wait_for(raw.ws.recv(), WAIT)
                        assert raw.ws.close_code == 1012
                        await until_logged(a, "CLUSTER_REJOINED", n + 1)
                        await until_ready(a)
                        await send_numbers(sender, range(n, n + 1), to=f"worker-{n}")
                        await until(partial(holds, worker, [n]), f"worker-{n} served")
                        assert worker.stats.resumes >= 1
            fenced = [e for e in a.events() if e.get("event") == "CLUSTER_FENCED"]
            assert len(fenced) == ROUNDS
            epochs = [int(str(e["epoch"])) for e in a.events() if e["event"] == "CLUSTER_REJOINED"]
            assert len(epochs) == ROUNDS
            assert epochs == sorted(set(epochs))  # a new one each time
            assert list((await healthz(b))["recovered"]) == ["a"]
        finally:
            stop(a)
            stop(b)


async def until_known(proc: LobbyProcess, agents: int) -> None:
    """Until `proc`'s node knows `agents` agents."""
    async with asyncio.timeout(WAIT):
        while (await agents_known(proc))[0] < agents:
            await asyncio.sleep(0.05)


async def test_a_failover_that_fails_half_way_leaves_the_node_to_rejoin_with_its_journal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """b's every failover fails right after claiming the epoch (test hook): a, paused past the
    dead window and resumed, finds itself fenced, rejoins, and loads its own journal: what
    its offline agent's mailbox held is delivered."""
    async with nats_server(tmp_path) as nats:
        a = cluster_node(tmp_path, nats, "a")
        monkeypatch.setenv("LOBBY_TEST_RECOVERY_FAILS", "1")
        b = cluster_node(tmp_path, nats, "b")
        monkeypatch.delenv("LOBBY_TEST_RECOVERY_FAILS")
        try:
            sender = Agent("sender", lobby_url=[b.url], reconnect_max_delay=0.3)
            async with sender:
                for n in range(ROUNDS):
                    box = Collector([a.url], agent_id=f"box-{n}")
                    async with box:
                        pass  # registered on a, then offline: a holds what is sent to it
                    await send_numbers(sender, range(3), to=f"box-{n}")
                    await until(lambda: len(sender._dispatcher.outbound) == 0, "ACCEPTED")
                    with paused(a):
                        await until_logged(b, "CLUSTER_RECOVERY_FAILED", n + 1, "a")
                    await until_logged(a, "CLUSTER_REJOINED", n + 1)
                    await until_ready(a)
                    box = Collector([a.url], agent_id=f"box-{n}")
                    async with box:
                        await until(partial(holds, box, [0, 1, 2]), f"box-{n}'s mailbox")
            assert count(b, "CLUSTER_NODE_RECOVERED") == 0
            assert count(a, "CLUSTER_FENCED") == ROUNDS
            assert (await healthz(b))["recovered"] == {}
        finally:
            stop(a)
            stop(b)


async def test_a_fenced_server_refuses_register_closes_with_1012_and_is_not_ready(
    tmp_path: Path,
) -> None:
    """What stepping down does, in one process (the memory transport, no NATS)."""
    async with serving(tmp_path, "memory") as served:
        server: LobbyServer = served.lobby
        async with served.connect() as ws:
            await ws.send(frame("alice", "REGISTER", {}))
            assert (await reply(ws))["message_type"] == "REGISTER_ACK"
            async with served.connect() as fresh:
                server.fence("test: another node claimed this one")
                assert server.stepped_down.is_set()
                with pytest.raises(memory.ConnectionClosed):
                    await ws.recv()
                assert ws.close_code == 1012
                await fresh.send(frame("bob", "REGISTER", {}))
                error = await reply(fresh)
                assert error["message_type"] == "ERROR"
                assert error["payload"]["code"] == "node_unavailable"
                assert error["payload"]["original_message_type"] == "REGISTER"
                answer = server.readiness()
                assert answer.status == 503
                assert "another node claimed this one" in orjson.loads(answer.body)["reason"]
