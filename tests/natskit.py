"""A real NATS server with JetStream for tests, started as a user would: `lobby nats`."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import nats
from nats.aio.client import Client

START_BOUND = 15.0
"""Seconds a NATS server may take to accept clients (a generous bound, not a timing claim)."""


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@dataclass
class NatsServer:
    url: str
    process: asyncio.subprocess.Process
    store_dir: Path
    log: Path
    command: list[str]
    """What started it (`restart` runs it again: the same port, the same store)."""


async def restart(server: NatsServer) -> None:
    """Start `server` again as it was started, once its process has ended (killed, say);
    returns once it answers clients."""
    await server.process.wait()
    with server.log.open("ab") as out:
        server.process = await asyncio.create_subprocess_exec(
            *server.command, stdout=out, stderr=subprocess.STDOUT
        )
    await _until_it_answers(server)


async def connect(url: str) -> Client:
    return await nats.connect(url, connect_timeout=2, max_reconnect_attempts=0)


@asynccontextmanager
async def nats_server(directory: Path) -> AsyncIterator[NatsServer]:
    """`lobby nats` on a free port, its store under `directory`; stopped (SIGTERM, then
    SIGKILL) on exit."""
    server = await _start(directory, "nats", [])
    try:
        await _until_it_answers(server)
        yield server
    finally:
        await _stop(server)


@asynccontextmanager
async def nats_cluster(directory: Path, size: int = 3) -> AsyncIterator[list[NatsServer]]:
    """`size` servers of one NATS cluster, each `lobby nats --name --cluster-port --routes` as
    docs/cluster.md's recipe, on free ports; yielded once each answers clients and JetStream has
    a meta leader."""
    routes = [f"nats://127.0.0.1:{free_port()}" for _ in range(size)]
    servers: list[NatsServer] = []
    try:
        for n, route in enumerate(routes):
            others = ",".join(r for r in routes if r != route)
            cluster = ["--name", f"s{n}", "--cluster-port", route.rsplit(":", 1)[1]]
            servers.append(await _start(directory, f"s{n}", [*cluster, "--routes", others]))
        for server in servers:
            await _until_it_answers(server)
        await _until_jetstream_is_ready(servers[0])
        yield servers
    finally:
        for server in servers:
            await _stop(server)


async def _start(directory: Path, name: str, extra: list[str]) -> NatsServer:
    port = free_port()
    store_dir, log = directory / name, directory / f"{name}.log"
    command = [sys.executable, "-m", "lobby", "nats", "--port", str(port)]
    command += ["--store-dir", str(store_dir), *extra]
    with log.open("wb") as out:
        process = await asyncio.create_subprocess_exec(
            *command, stdout=out, stderr=subprocess.STDOUT
        )
    return NatsServer(f"nats://127.0.0.1:{port}", process, store_dir, log, command)


async def _stop(server: NatsServer) -> None:
    process = server.process
    if process.returncode is None:
        process.terminate()
        try:
            await asyncio.wait_for(process.wait(), 10)
        except TimeoutError:
            process.kill()
            await process.wait()


async def _until_jetstream_is_ready(server: NatsServer) -> None:
    """Until the cluster has elected its JetStream meta leader (account info answers)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + START_BOUND
    client = await connect(server.url)
    try:
        while True:
            try:
                await client.jetstream().account_info()
                return
            except (nats.errors.Error, TimeoutError):
                if loop.time() > deadline:
                    raise
                await asyncio.sleep(0.1)
    finally:
        await client.close()


async def _until_it_answers(server: NatsServer) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + START_BOUND
    while True:
        if server.process.returncode is not None:
            raise RuntimeError(f"lobby nats exited: {server.log.read_text()[-2000:]}")
        try:
            client = await connect(server.url)
        except (OSError, nats.errors.Error):
            if loop.time() > deadline:
                raise
            await asyncio.sleep(0.05)
        else:
            await client.close()
            return
