"""Failover: a lobby node SIGKILLed with messages in flight between agents on two nodes; the
survivor adopts its agents from its journal on JetStream, resends what the dead node never
confirmed, and the agents resume on it with nothing lost, nothing repeated, in order. Real
`nats-server -js`, real `lobby serve --cluster` processes, SDK agents."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

import pytest
import websockets.asyncio.client

from agent_sdk import Agent
from tests.conftest import LobbyProcess
from tests.natskit import nats_server
from tests.sdklogs import sdk_events
from tests.test_cluster_node import journal_and_snapshots, node
from tests.test_cluster_registry import agent, healthz, until_nodes
from tests.test_durability import Collector, send_numbers, stop
from tests.waiting import BOUND, until
from tests.wsclient import frame, reply

PER_SENDER = 500
"""Messages each of the two senders streams: 1,000 in flight when the node dies."""


async def agents_known(*nodes: LobbyProcess) -> list[int]:
    return [int((await healthz(proc))["agents"]) for proc in nodes]


async def test_a_node_killed_with_1000_messages_in_flight_fails_over_losing_nothing(
    tmp_path: Path,
) -> None:
    async with nats_server(tmp_path) as nats:
        a, b = node(tmp_path / "a", nats, "a"), node(tmp_path / "b", nats, "b")
        try:
            # One collector and one sender on each node, each sender streaming to the
            # collector on the other node; every agent knows both addresses, its own first.
            on_b = Collector([b.url, a.url], agent_id="collector-b")
            on_a = Collector([a.url, b.url], agent_id="collector-a")
            sender_a = Agent("sender-a", lobby_url=[a.url, b.url], reconnect_max_delay=0.3)
            sender_b = Agent("sender-b", lobby_url=[b.url, a.url], reconnect_max_delay=0.3)
            async with on_a, on_b, sender_a, sender_b:
                async with asyncio.timeout(BOUND):  # each node knows every agent
                    while await agents_known(a, b) != [4, 4]:
                        await asyncio.sleep(0.05)
                streams = [
                    asyncio.create_task(
                        send_numbers(sender_a, range(PER_SENDER), to="collector-b", pause=0.002)
                    ),
                    asyncio.create_task(
                        send_numbers(sender_b, range(PER_SENDER), to="collector-a", pause=0.002)
                    ),
                ]
                await until(lambda: len(on_b.seen) >= 100 and len(on_a.seen) >= 100)
                b.signal(signal.SIGKILL)
                b.wait(10)
                await asyncio.gather(*streams)
                # Every message ACCEPTED in the end (the senders resend what was not).
                await until(lambda: len(sender_a._dispatcher.outbound) == 0, "sender-a confirmed")
                await until(lambda: len(sender_b._dispatcher.outbound) == 0, "sender-b confirmed")
                # One more from each: it arrives behind anything still being resent.
                await send_numbers(sender_a, range(PER_SENDER, PER_SENDER + 1), to="collector-b")
                await send_numbers(sender_b, range(PER_SENDER, PER_SENDER + 1), to="collector-a")
                await until(lambda: PER_SENDER in on_b.seen and PER_SENDER in on_a.seen)
                # Presence: node b is gone from a's view, its agents are a's, all online.
                health = await healthz(a)
                assert health["nodes"] == ["a"]
                assert health["recovered"] == {"b": 2}  # collector-b and sender-b
                assert health["agents_online"] == 4
            # Exactly once, in order per sender, to the application.
            assert on_b.seen == list(range(PER_SENDER + 1))
            assert on_a.seen == list(range(PER_SENDER + 1))
            assert on_b.stats.resumes >= 1  # resumed on node a, with its token
            # The dead node's journal is a's now: nothing of it is left under its name.
            assert await journal_and_snapshots(nats, "b") == (0, 0)
        finally:
            stop(a)
            stop(b)


async def test_an_agent_of_a_node_stopped_cleanly_resumes_on_another_at_once(
    tmp_path: Path,
) -> None:
    async with nats_server(tmp_path) as nats:
        a, b = node(tmp_path / "a", nats, "a"), node(tmp_path / "b", nats, "b")
        try:
            async with agent(b, "mover") as on_b:
                token = on_b.token
                async with asyncio.timeout(BOUND):
                    while await agents_known(a) != [1]:
                        await asyncio.sleep(0.05)
            stop(b)  # SIGTERM: its key is deleted, it is not failed over
            await until_nodes(a, ["a"])
            async with websockets.asyncio.client.connect(a.url) as ws:
                await ws.send(frame("mover", "REGISTER", {}, auth_token=token))
                ack = await reply(ws)  # its home does not answer the probe: it was stopped
                assert ack["message_type"] == "REGISTER_ACK", ack
                assert ack["payload"]["status"] == "success_resumed"
        finally:
            stop(a)
            stop(b)


async def kill_once_known(survivor: LobbyProcess, home: LobbyProcess) -> None:
    """Once both nodes know the one agent, kill its home (SIGKILL)."""
    async with asyncio.timeout(BOUND):
        while await agents_known(survivor, home) != [1, 1]:
            await asyncio.sleep(0.05)
    home.signal(signal.SIGKILL)
    home.wait(10)


async def test_a_resume_on_the_survivor_waits_for_the_failover_and_is_not_refused(
    tmp_path: Path,
) -> None:
    """The agent of a killed node resumes on the survivor while it fails that node over: the
    survivor holds the resume until the agent is adopted, then answers it; no 1013."""
    async with nats_server(tmp_path) as nats:
        a = node(tmp_path / "a", nats, "a", "--cluster-dead-after", "4")
        b = node(tmp_path / "b", nats, "b", "--cluster-dead-after", "4")
        try:
            mover = Agent("mover", lobby_url=[b.url, a.url], reconnect_max_delay=0.2)
            with sdk_events() as events:
                async with mover:
                    await kill_once_known(a, b)
                    await until(lambda: mover.stats.resumes >= 1, "mover resumed on a")
            refused = [e["line"] for e in events if "1013" in str(e.get("error"))]
            assert refused == []
            assert (await healthz(a))["recovered"] == {"b": 1}
        finally:
            stop(a)
            stop(b)


async def test_an_agent_whose_resume_the_survivor_closed_with_1013_tries_it_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The survivor's failover of the dead node does not complete (its every attempt fails:
    the test hook): it closes the held resume with 1013 once held `FAILOVER_HOLD`, and the
    agent tries the survivor again, not its dead node in turn with it."""
    async with nats_server(tmp_path) as nats:
        monkeypatch.setenv("LOBBY_TEST_RECOVERY_FAILS", "1")
        a = node(tmp_path / "a", nats, "a", "--cluster-dead-after", "4")
        monkeypatch.delenv("LOBBY_TEST_RECOVERY_FAILS")
        b = node(tmp_path / "b", nats, "b", "--cluster-dead-after", "4")
        try:
            mover = Agent("mover", lobby_url=[b.url, a.url], reconnect_max_delay=0.2)
            with sdk_events() as events:
                async with mover:
                    await kill_once_known(a, b)

                    def held() -> list[int]:
                        return [
                            at
                            for at, event in enumerate(events)
                            if event["event"] == "REGISTER_INTERRUPTED"
                            and event.get("url") == a.url
                            and "1013" in str(event.get("error"))
                        ]

                    await until(lambda: bool(held()), "a closed the held resume with 1013")
                    # Moving on would try b within the SDK's 0.2 s backoff.
                    await asyncio.sleep(1.0)
            assert mover.stats.resumes == 0
            again = [
                e["line"]
                for e in events[held()[0] :]
                if e["event"] == "CONNECT_FAILED" and e.get("url") == b.url
            ]
            assert again == []
        finally:
            stop(a)
            stop(b)
