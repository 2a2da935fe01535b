"""The cluster under faults, for real: `lobby serve --cluster` processes on a real nats-server,
SDK agents streaming numbered messages between nodes, a fault injected mid-stream. The
invariant (PROTOCOL.md §7): every message ACCEPTED reaches its receiver, once to the
application, in order per sender; nothing is lost, nothing is invented."""

from __future__ import annotations

import asyncio
import itertools
import signal
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import websockets.asyncio.client
from websockets.exceptions import ConnectionClosed

from agent_sdk import Agent
from tests.conftest import LobbyProcess, start_lobby_process
from tests.natskit import nats_cluster, nats_server, restart
from tests.test_cluster_failover import agents_known
from tests.test_cluster_handover import until_all
from tests.test_cluster_node import node
from tests.test_cluster_registry import agent, healthz
from tests.test_cluster_routing import send
from tests.test_durability import Collector, send_numbers, stop
from tests.waiting import BOUND, until
from tests.wsclient import frame, reply

OUTAGE = 3.0
"""Seconds the nats-server stays down (a restart by an operator or a supervisor)."""
PAUSE = 12.0
"""Seconds a NATS server stays paused: past `--cluster-dead-after` (10 s)."""
QUICK = ("--cluster-dead-after", "3.5")
"""Where a node really dies: failed over sooner than the default 10 s, to keep tests short."""
PER_ROUND = 300
"""Messages each sender streams per round; the fault falls a third of the way in."""


def events(proc: LobbyProcess, name: str) -> list[dict[str, object]]:
    return [e for e in proc.events() if e.get("event") == name]


class CrossStreams:
    """Two nodes, a collector and a sender on each, each sender streaming numbered REQUESTs
    to the collector on the other node; every agent knows both nodes, its own first."""

    def __init__(self, a: LobbyProcess, b: LobbyProcess, prefix: str = "") -> None:
        self.nodes = (a, b)
        self.on_a = Collector([a.url, b.url], agent_id=f"{prefix}collector-a")
        self.on_b = Collector([b.url, a.url], agent_id=f"{prefix}collector-b")
        self.sender_a = Agent(
            f"{prefix}sender-a", lobby_url=[a.url, b.url], reconnect_max_delay=0.3
        )
        self.sender_b = Agent(
            f"{prefix}sender-b", lobby_url=[b.url, a.url], reconnect_max_delay=0.3
        )
        self.sent = 0

    async def __aenter__(self) -> CrossStreams:
        for agent_ in (self.on_a, self.on_b, self.sender_a, self.sender_b):
            await agent_.__aenter__()
        return self

    async def __aexit__(self, *exc: object) -> None:
        for agent_ in (self.sender_a, self.sender_b, self.on_a, self.on_b):
            await agent_.__aexit__(None, None, None)

    async def round(self, fault: Callable[[], Awaitable[None]], count: int = PER_ROUND) -> None:
        """Stream `count` more from each sender, `fault` a third of the way in; then check
        the invariant: every number once to the application, in order, nothing else."""
        numbers = range(self.sent, self.sent + count)
        self.sent = numbers.stop
        to_b = send_numbers(self.sender_a, numbers, to=self.on_b.agent_id, pause=0.01)
        to_a = send_numbers(self.sender_b, numbers, to=self.on_a.agent_id, pause=0.01)
        streams = [asyncio.create_task(to_b), asyncio.create_task(to_a)]
        await past(numbers[count // 3], self.on_a, self.on_b)
        await fault()
        await asyncio.gather(*streams)
        for sender in (self.sender_a, self.sender_b):  # every one ACCEPTED in the end
            await until(lambda s=sender: len(s._dispatcher.outbound) == 0, "confirmed")  # type: ignore[misc]
        await past(self.sent - 1, self.on_a, self.on_b)
        assert self.on_b.seen == list(range(self.sent))
        assert self.on_a.seen == list(range(self.sent))


async def past(n: int, *collectors: Collector) -> None:
    """Until each collector has seen more than `n` messages."""
    await until(lambda: all(len(c.seen) > n for c in collectors), f"past {n}")


async def test_a_nats_restart_mid_stream_loses_nothing_accepted_and_fails_over_nobody(
    tmp_path: Path,
) -> None:
    async with nats_server(tmp_path) as nats:
        a, b = node(tmp_path / "a", nats, "a"), node(tmp_path / "b", nats, "b")

        async def nats_restarted() -> None:
            nats.process.kill()
            await nats.process.wait()
            await asyncio.sleep(OUTAGE)  # the outage itself, not a wait for a result
            await restart(nats)

        try:
            async with CrossStreams(a, b) as streams:
                for _ in range(2):
                    await streams.round(nats_restarted)
            for proc in (a, b):  # a blip of NATS is not a dead node
                assert events(proc, "CLUSTER_RECOVERY_STARTED") == []
                assert (await healthz(proc))["recovered"] == {}
        finally:
            stop(a)
            stop(b)


async def test_nats_away_past_the_commit_deadline_steps_nodes_down_and_loses_nothing_accepted(
    tmp_path: Path,
) -> None:
    """NATS stays away longer than a commit may retry (`--cluster-write-deadline 1`) while
    agents on node a also talk among themselves: a's commit fails, so a steps down (what it
    holds is ahead of what it stored), closes its agents with 1012, commits nothing more and
    rejoins from its journal once NATS is back. Cross-node and local streams lose nothing."""
    async with nats_server(tmp_path) as nats:
        deadline = ("--cluster-write-deadline", "1")
        a, b = (
            node(tmp_path / "a", nats, "a", *deadline),
            node(tmp_path / "b", nats, "b", *deadline),
        )
        local = Collector([a.url, b.url], agent_id="local-collector")
        local_sender = Agent("local-sender", lobby_url=[a.url, b.url], reconnect_max_delay=0.3)

        sending: list[asyncio.Task[None]] = []

        async def nats_away() -> None:
            nats.process.kill()
            await nats.process.wait()
            to_local = send_numbers(local_sender, range(100), to=local.agent_id, pause=0.01)
            sending.append(asyncio.create_task(to_local))
            await until(lambda: events(a, "CLUSTER_FENCED"), "a stepped down")
            await restart(nats)

        try:
            async with local, local_sender, CrossStreams(a, b) as streams:
                await streams.round(nats_away)
                await asyncio.gather(*sending)
                await until(lambda: len(local_sender._dispatcher.outbound) == 0, "confirmed")
                await past(99, local)
                assert local.seen == list(range(100))
            assert events(a, "STORE_WRITE_FAILED")
            assert events(a, "CLUSTER_REJOINED")
        finally:
            stop(a)
            stop(b)


async def test_one_server_of_three_killed_mid_stream_loses_nothing_accepted(
    tmp_path: Path,
) -> None:
    """Each node on its own server of a 3-server R3 cluster; the first node's server is
    SIGKILLed mid-stream (the node reconnects to another), then restarted."""
    async with nats_cluster(tmp_path) as servers:
        urls = [s.url for s in servers]
        a = node_on(tmp_path / "a", "a", [urls[0], *urls[1:]])
        b = node_on(tmp_path / "b", "b", [urls[1], urls[2], urls[0]])

        async def server_killed() -> None:
            servers[0].process.kill()
            await servers[0].process.wait()

        async def server_back() -> None:
            await restart(servers[0])

        try:
            async with CrossStreams(a, b) as streams:
                await streams.round(server_killed)
                await streams.round(server_back)
            for proc in (a, b):
                assert events(proc, "CLUSTER_RECOVERY_STARTED") == []
        finally:
            stop(a)
            stop(b)


async def test_one_server_of_three_paused_past_the_dead_window_fails_nobody_over(
    tmp_path: Path,
) -> None:
    """The first node's server of a 3-server cluster is SIGSTOPped for longer than
    `--cluster-dead-after` mid-stream: that node (given that server alone, it learns the
    others from it) moves to another server before anyone may judge it dead, and nothing
    ACCEPTED is lost."""
    async with nats_cluster(tmp_path) as servers:
        urls = [s.url for s in servers]
        a = node_on(tmp_path / "a", "a", [urls[0]])
        b = node_on(tmp_path / "b", "b", [urls[1], urls[2], urls[0]])

        async def server_paused() -> None:
            servers[0].process.send_signal(signal.SIGSTOP)
            await asyncio.sleep(PAUSE)  # the stall itself, not a wait for a result
            servers[0].process.send_signal(signal.SIGCONT)

        try:
            async with CrossStreams(a, b) as streams:
                await streams.round(server_paused)
            for proc in (a, b):
                assert events(proc, "CLUSTER_RECOVERY_STARTED") == []
                assert events(proc, "CLUSTER_FENCED") == []
        finally:
            servers[0].process.send_signal(signal.SIGCONT)
            stop(a)
            stop(b)


async def test_a_node_killed_just_after_new_agents_first_messages_loses_nothing_accepted(
    tmp_path: Path,
) -> None:
    """Agents registered a moment ago on b stream to agents on a; b is SIGKILLed as soon as
    their first messages arrive. The senders resume on a, which failed b over, and resend
    what was not ACCEPTED."""
    async with nats_server(tmp_path) as nats:
        a, b = node(tmp_path / "a", nats, "a", *QUICK), node(tmp_path / "b", nats, "b", *QUICK)

        async def b_killed() -> None:
            b.signal(signal.SIGKILL)
            b.wait(10)

        try:
            async with CrossStreams(a, b) as streams:
                await streams.round(b_killed, count=90)
        finally:
            stop(a)
            stop(b)


def node_on(data_dir: Path, node_id: str, urls: list[str]) -> LobbyProcess:
    """A lobby node on a 3-server NATS cluster, `urls` in the order it tries them."""
    return start_lobby_process(
        data_dir, "--cluster", ",".join(urls), "--node-id", node_id, "--cluster-replicas", "3"
    )


HELD = 1_500
"""Messages bob's old home holds for him when he resumes elsewhere: a handover of about
300 KB, which goes through the object store."""


def stopped(proc: LobbyProcess) -> bool:
    """Whether `proc` stopped itself at its `LOBBY_STOP_AT` step (state T in /proc)."""
    stat = Path(f"/proc/{proc.process.pid}/stat").read_text()
    return stat.rsplit(")", 1)[1].split()[0] == "T"


async def resumed_with_everything(urls: list[str], token: str) -> list[dict[str, Any]]:
    """Resume bob on the first node that takes him (others close with 1013 while his home is
    failed over), then read until all `HELD` messages came on that connection."""
    every = {f"m{n}" for n in range(HELD)}
    async with asyncio.timeout(BOUND):
        for attempt in itertools.count():
            url = urls[attempt % len(urls)]
            try:
                async with websockets.asyncio.client.connect(url) as ws:
                    await ws.send(frame("bob", "REGISTER", {"acks": True}, auth_token=token))
                    ack = await reply(ws)
                    if ack["message_type"] != "REGISTER_ACK":
                        await asyncio.sleep(0.2)
                        continue
                    assert ack["payload"]["status"] == "success_resumed", ack
                    return await until_all(ws, every)
            except (OSError, ConnectionClosed):
                await asyncio.sleep(0.2)
    raise AssertionError("unreachable")


@pytest.mark.parametrize(
    ("step", "killed"),
    [
        ("handover_released", "old home"),
        ("handover_committed", "old home"),
        ("handover_answered", "old home"),
        ("handover_adopted", "new home"),
    ],
)
async def test_a_node_killed_at_a_step_of_a_handover_loses_none_of_the_mailbox(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, step: str, killed: str
) -> None:
    """Bob's home a holds 1,500 messages for him; he resumes on b, and one of the two nodes
    is SIGKILLed at `step`. The survivor fails the other over, and bob, resuming on whichever
    node takes him, gets every message, each sender's in order."""
    async with nats_server(tmp_path) as nats:
        with monkeypatch.context() as env:
            env.setenv("LOBBY_STOP_AT", step)
            a = node(tmp_path / "a", nats, "a", *QUICK) if killed == "old home" else None
            b = node(tmp_path / "b", nats, "b", *QUICK) if killed == "new home" else None
        a = a or node(tmp_path / "a", nats, "a", *QUICK)
        b = b or node(tmp_path / "b", nats, "b", *QUICK)
        victim, survivor = (a, b) if killed == "old home" else (b, a)
        try:
            async with agent(a, "bob", acks=True) as bob:
                token = bob.token
            async with agent(a, "alice", acks=True) as alice:
                for n in range(HELD):
                    await send(alice, "bob", "TEXT", {"content": str(n)}, message_id=f"m{n}")
                async with asyncio.timeout(BOUND):  # every one stored on a
                    while (await reply(alice.ws)).get("payload", {}).get("message_id") != (
                        f"m{HELD - 1}"
                    ):
                        pass
            async with asyncio.timeout(BOUND):
                while await agents_known(b) != [2]:
                    await asyncio.sleep(0.05)
            resuming = asyncio.create_task(resumed_with_everything([b.url, a.url], token))
            await until(lambda: stopped(victim), f"{killed} stopped at {step}")
            victim.signal(signal.SIGKILL)
            victim.wait(10)
            got = await resuming
            assert [int(m["payload"]["content"]) for m in got] == list(range(HELD))
            seqs = [m["seq"] for m in got]
            assert seqs == sorted(set(seqs))
            dead = "a" if victim is a else "b"
            async with asyncio.timeout(BOUND):
                while dead not in (await healthz(survivor))["recovered"]:
                    await asyncio.sleep(0.1)
            # Once the dead node is failed over, bob's messages are held once, not twice.
            again = await resumed_with_everything([survivor.url], token)
            assert [(m["seq"], m["message_id"]) for m in again] == [
                (m["seq"], m["message_id"]) for m in got
            ]
        finally:
            stop(a)
            stop(b)
