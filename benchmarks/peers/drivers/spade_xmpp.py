"""SPADE 4 (XMPP) run by `.venv-peers/spade/bin/python`: the broker is SPADE's embedded XMPP
server (`spade run`: pyjabber, in-memory database, its own process); echo agents answer each
REQUEST's body with a RESPONSE, askers wait for each answer (one outstanding), and one-way is one
agent sending to another that counts. Agents register in-band (`auto_register`) and log in with
a password over a plain local stream; messages are in memory, not persisted or acknowledged."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import time
from typing import Any

import spade
from spade.agent import Agent
from spade.behaviour import CyclicBehaviour, OneShotBehaviour
from spade.message import Message

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from pattern import Window, arguments, emit, request_payload, response_payload

DOMAIN = "localhost"
PASSWORD = "bench-password"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class Echo(Agent):
    class Serve(CyclicBehaviour):
        async def run(self) -> None:
            message = await self.receive(timeout=60)
            if message is None:
                return
            reply = message.make_reply()
            reply.body = json.dumps(response_payload(json.loads(message.body).get("n")))
            await self.send(reply)

    async def setup(self) -> None:
        self.add_behaviour(self.Serve())


class Asker(Agent):
    def __init__(self, jid: str, password: str, port: int, peer: str, n: int) -> None:
        super().__init__(jid, password, port=port)
        self.peer, self.n, self.rtts = peer, n, []  # type: ignore[var-annotated]

    class Ask(OneShotBehaviour):
        async def run(self) -> None:
            agent: Any = self.agent
            for i in range(agent.n):
                started = time.perf_counter()
                message = Message(to=agent.peer, body=json.dumps(request_payload(i)))
                message.set_metadata("performative", "request")
                await self.send(message)
                if await self.receive(timeout=60) is None:
                    raise RuntimeError("no RESPONSE within 60 s")
                agent.rtts.append(time.perf_counter() - started)


class Counter(Agent):
    def __init__(self, jid: str, password: str, port: int, expected: int) -> None:
        super().__init__(jid, password, port=port)
        self.expected, self.seen, self.done = expected, 0, asyncio.Event()

    class Count(CyclicBehaviour):
        async def run(self) -> None:
            agent: Any = self.agent
            if await self.receive(timeout=60) is not None:
                agent.seen += 1
                if agent.seen == agent.expected:
                    agent.done.set()

    async def setup(self) -> None:
        self.add_behaviour(self.Count())


class Sender(Agent):
    def __init__(self, jid: str, password: str, port: int, peer: str, n: int) -> None:
        super().__init__(jid, password, port=port)
        self.peer, self.n = peer, n

    class Send(OneShotBehaviour):
        async def run(self) -> None:
            agent: Any = self.agent
            for i in range(agent.n):
                await self.send(Message(to=agent.peer, body=json.dumps(request_payload(i))))


async def responders(port: int, pairs: int, one_way: int) -> None:
    """The child process: echo agents and the counter, in a container of their own (SPADE
    hands a message to an agent of the same process directly, never through the server)."""
    agents: list[Agent] = [
        Echo(f"{tag}e{i}@{DOMAIN}", PASSWORD, port=port)
        for tag in ("warm", "rr")
        for i in range(pairs)
    ]
    counter = Counter(f"count@{DOMAIN}", PASSWORD, port, one_way)
    for agent in [*agents, counter]:
        await agent.start(auto_register=True)
    print("ready", flush=True)
    await counter.done.wait()
    print("counted", flush=True)
    await asyncio.sleep(3600)  # until the driver ends this process


async def start_askers(port: int, pairs: int, n: int, tag: str) -> list[Agent]:
    """Askers registered and logged in (outside the measured window)."""
    askers: list[Agent] = [
        Asker(f"{tag}a{i}@{DOMAIN}", PASSWORD, port, f"{tag}e{i}@{DOMAIN}", n) for i in range(pairs)
    ]
    for agent in askers:
        await agent.start(auto_register=True)
    return askers


async def rounds(askers: list[Agent]) -> list[float]:
    behaviours = [Asker.Ask() for _ in askers]
    for agent, behaviour in zip(askers, behaviours, strict=True):
        agent.add_behaviour(behaviour)
    await asyncio.gather(*(b.join() for b in behaviours))
    return [rtt for agent in askers for rtt in getattr(agent, "rtts", [])]


async def main(port: int, broker_pid: int, child: subprocess.Popen[str]) -> dict[str, Any]:
    args = arguments()
    assert child.stdout is not None
    try:
        if await asyncio.to_thread(child.stdout.readline) != "ready\n":
            raise RuntimeError("the SPADE responders did not start")
        warm = await start_askers(port, args.pairs, 5, "warm")
        await rounds(warm)
        askers = await start_askers(port, args.pairs, args.round_trips, "rr")
        window = Window(broker_pid, (child.pid,))
        rtts = await rounds(askers)
        request_response = window.close(2 * len(rtts), rtts)
        sender = Sender(f"send@{DOMAIN}", PASSWORD, port, f"count@{DOMAIN}", args.one_way)
        await sender.start(auto_register=True)
        window = Window(broker_pid, (child.pid,))
        sender.add_behaviour(Sender.Send())
        line = await asyncio.wait_for(asyncio.to_thread(child.stdout.readline), 300)
        if line != "counted\n":
            raise RuntimeError("the SPADE counter did not see every message")
        one_way = window.close(args.one_way)
        for agent in [*warm, *askers, sender]:
            await agent.stop()
        return {"request_response": request_response, "one_way": one_way}
    finally:
        child.terminate()
        child.wait(10)


def serve() -> None:
    port = free_port()
    spade_cli = os.path.join(os.path.dirname(sys.executable), "spade")
    command = [spade_cli, "run", "--host", DOMAIN, "--client_port", str(port)]
    command += ["--server_port", str(free_port()), "--memory"]
    broker = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), 0.2).close()
                break
            except OSError:
                if time.monotonic() > deadline or broker.poll() is not None:
                    raise RuntimeError("the SPADE XMPP server did not listen within 20 s") from None
                time.sleep(0.05)
        result: dict[str, Any] = {}
        args = arguments()
        child = subprocess.Popen(
            [
                sys.executable,
                __file__,
                "--responders",
                str(port),
                str(args.pairs),
                str(args.one_way),
            ],
            stdout=subprocess.PIPE,
            text=True,
        )

        async def run() -> None:
            result.update(await main(port, broker.pid, child))

        spade.run(run())
        if not result:
            raise RuntimeError("the SPADE patterns did not finish (see stderr)")
        emit(result)
    finally:
        broker.terminate()
        broker.wait(10)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--responders"]:
        port, pairs, one_way = (int(a) for a in sys.argv[2:5])
        spade.run(responders(port, pairs, one_way))
    else:
        serve()
