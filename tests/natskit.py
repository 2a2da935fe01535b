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


async def connect(url: str) -> Client:
    return await nats.connect(url, connect_timeout=2, max_reconnect_attempts=0)


@asynccontextmanager
async def nats_server(directory: Path) -> AsyncIterator[NatsServer]:
    """`lobby nats` on a free port, its store under `directory`; stopped (SIGTERM, then
    SIGKILL) on exit."""
    port = free_port()
    store_dir, log = directory / "nats", directory / "nats.log"
    with log.open("wb") as out:
        process = await asyncio.create_subprocess_exec(
            *(sys.executable, "-m", "lobby", "nats", "--port", str(port)),
            *("--store-dir", str(store_dir)),
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    server = NatsServer(f"nats://127.0.0.1:{port}", process, store_dir, log)
    try:
        await _until_it_answers(server)
        yield server
    finally:
        if process.returncode is None:
            process.terminate()
            try:
                await asyncio.wait_for(process.wait(), 10)
            except TimeoutError:
                process.kill()
                await process.wait()


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
