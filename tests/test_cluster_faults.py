"""The cluster under faults, for real: `lobby serve --cluster` processes on a real nats-server,
SDK agents streaming numbered messages between nodes, a fault injected mid-stream. The
invariant (PROTOCOL.md §7): every message ACCEPTED reaches its receiver, once to the
application, in order per sender; nothing is lost, nothing is invented."""

from __future__ import annotations

import asyncio
import itertools
import signal
from pathlib import Path
from typing import Any

import pytest
import websockets.asyncio.client
from websockets.exceptions import ConnectionClosed

from agent_sdk import Agent
from tests.conftest import LobbyProcess
from tests.natskit import nats_server
from tests.test_cluster_failover import agents_known
from tests.test_cluster_handover import until_all
from tests.test_cluster_node import node
from tests.test_cluster_registry import agent, healthz
from tests.test_cluster_routing import send
from tests.test_durability import Collector, stop
from tests.waiting import BOUND, until
from tests.wsclient import frame, reply


def events(proc: LobbyProcess, name: str) -> list[dict[str, object]]:
    return [e for e in proc.events() if e.get("event") == name]


async def past(n: int, *collectors: Collector) -> None:
    """Until each collector has seen more than `n` messages."""
    await until(lambda: all(len(c.seen) > n for c in collectors), f"past {n}")


async def confirmed(sender: Agent) -> None:
    await until(lambda: len(sender._dispatcher.outbound) == 0, f"{sender.agent_id} confirmed")


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
            a = node(tmp_path / "a", nats, "a") if killed == "old home" else None
            b = node(tmp_path / "b", nats, "b") if killed == "new home" else None
        a = a or node(tmp_path / "a", nats, "a")
        b = b or node(tmp_path / "b", nats, "b")
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
