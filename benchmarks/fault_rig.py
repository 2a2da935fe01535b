"""The processes of one `faults` run (`benchmarks.faults`): `lobby nats` servers (one, or three
of a NATS cluster) and `lobby serve --cluster` nodes, each logging to a file in the run's
directory; `Rig.close()` SIGKILLs them all. Every wait here is bounded."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import nats
import nats.errors
import orjson

from benchmarks.harness import BenchError, free_port

START_BOUND = 20.0
"""Seconds a NATS server or a lobby node may take to start."""


class Proc:
    """A child process (a NATS server or a lobby node), its log in a file."""

    def __init__(self, name: str, command: list[str], log: Path, port: int, **env: str) -> None:
        self.name, self.command, self.log, self.port = name, command, log, port
        self.env = {**os.environ, **env}
        self.process = self._spawn()

    def _spawn(self) -> subprocess.Popen[bytes]:
        with self.log.open("ab") as out:
            return subprocess.Popen(
                self.command, stdout=out, stderr=subprocess.STDOUT, env=self.env
            )

    def restart(self) -> None:
        """Start it again as it was (same port, same store), once it has ended."""
        self.process.wait(10)
        self.process = self._spawn()

    def signal(self, signum: int) -> None:
        self.process.send_signal(signum)

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(10)

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/"

    def stopped(self) -> bool:
        """Whether it stopped itself at its `LOBBY_STOP_AT` step (state T)."""
        with contextlib.suppress(OSError):
            stat = Path(f"/proc/{self.process.pid}/stat").read_text()
            return stat.rsplit(")", 1)[1].split()[0] == "T"
        return False

    def events(self) -> list[dict[str, Any]]:
        out = []
        for line in self.log.read_bytes().splitlines():
            with contextlib.suppress(orjson.JSONDecodeError):
                event = orjson.loads(line)
                if isinstance(event, dict):
                    out.append(event)
        return out


class Rig:
    """The processes of one run, under `directory`; `close()` SIGKILLs every one."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.procs: list[Proc] = []

    def nats(self, name: str, *extra: str) -> Proc:
        port = free_port()
        command = [sys.executable, "-m", "lobby", "nats", "--port", str(port)]
        command += ["--store-dir", str(self.directory / name), *extra]
        self.procs.append(Proc(name, command, self.directory / f"{name}.log", port))
        return self.procs[-1]

    async def nats_cluster(self) -> list[Proc]:
        """Three servers of one NATS cluster, routed to each other (as tests/natskit.py)."""
        routes = [free_port() for _ in range(3)]
        servers = []
        for n, port in enumerate(routes):
            others = ",".join(f"nats://127.0.0.1:{p}" for p in routes if p != port)
            cluster = ("--name", f"s{n}", "--cluster-port", str(port), "--routes", others)
            servers.append(self.nats(f"s{n}", *cluster))
        for server in servers:
            await answering(server, jetstream=server is servers[-1])
        return servers

    def node(
        self,
        node_id: str,
        servers: list[Proc],
        replicas: int = 1,
        env: dict[str, str] | None = None,
    ) -> Proc:
        port = free_port()
        cluster = ",".join(f"nats://127.0.0.1:{s.port}" for s in servers)
        command = [sys.executable, "-m", "lobby", "serve", "--port", str(port)]
        command += ["--data-dir", str(self.directory / node_id), "--cluster", cluster]
        command += ["--node-id", node_id, "--cluster-replicas", str(replicas)]
        command += ["--message-rate", "0", "--registration-rate", "0", "--log-level", "info"]
        log = self.directory / f"lobby-{node_id}.log"
        self.procs.append(Proc(node_id, command, log, port, **(env or {})))
        return self.procs[-1]

    async def nodes(
        self, *placed: tuple[str, list[Proc]], replicas: int = 1, stop: dict[str, str] | None = None
    ) -> list[Proc]:
        """Nodes (id, its NATS servers in the order it tries them), each started once the one
        before answers (two nodes creating R3 buckets at once may fail to start); returned
        once each sees all. `stop`: node id -> its `LOBBY_STOP_AT` step."""
        nodes: list[Proc] = []
        for node_id, servers in placed:
            step = (stop or {}).get(node_id)
            env = {"LOBBY_STOP_AT": step} if step else None
            nodes.append(self.node(node_id, servers, replicas, env))
            await nodes_up(nodes[-1], expected=[node_id])
        await nodes_up(*nodes, expected=sorted(n for n, _ in placed))
        return nodes

    def close(self) -> None:
        for proc in reversed(self.procs):  # the nodes before their NATS servers
            proc.kill()


async def answering(server: Proc, jetstream: bool = False) -> None:
    """Until `server` takes clients (and, with `jetstream`, its cluster has a meta leader)."""
    async with asyncio.timeout(START_BOUND):
        while True:
            if server.process.poll() is not None:
                raise BenchError(f"{server.name} exited: {server.log.read_text()[-2000:]}")
            try:
                client = await nats.connect(
                    f"nats://127.0.0.1:{server.port}",
                    connect_timeout=1,
                    max_reconnect_attempts=0,
                    error_cb=quietly,  # not yet listening: expected, not worth a traceback
                )
            except (OSError, nats.errors.Error):
                await asyncio.sleep(0.05)
                continue
            try:
                if not jetstream:
                    return
                with contextlib.suppress(nats.errors.Error, TimeoutError):
                    await client.jetstream().account_info()
                    return
            finally:
                await client.close()
            await asyncio.sleep(0.1)


async def until(condition: Callable[[], object], bound: float) -> bool:
    """Whether `condition()` came true within `bound` seconds, checked every 20 ms: it reads
    other processes' state (/proc, what agents received), which no event announces."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + bound
    while not condition():
        if loop.time() > deadline:
            return False
        await asyncio.sleep(0.02)
    return True


async def quietly(error: Exception) -> None:
    pass


def http_get(proc: Proc, path: str) -> tuple[int, dict[str, Any]]:
    """(status, JSON body) of GET `path` on a node; (0, {}) if it does not answer in 2 s."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{proc.port}{path}", timeout=2) as answer:
            return answer.status, orjson.loads(answer.read())
    except urllib.error.HTTPError as error:
        return error.code, orjson.loads(error.read() or b"{}")
    except (OSError, orjson.JSONDecodeError):
        return 0, {}


async def nodes_up(*nodes: Proc, expected: list[str]) -> None:
    """Until each node answers /healthz and sees the nodes `expected` (at least) alive."""
    async with asyncio.timeout(START_BOUND):
        for node in nodes:
            while True:
                for proc in nodes:
                    if proc.process.poll() is not None:
                        raise BenchError(f"{proc.name} exited: {proc.log.read_text()[-2000:]}")
                health = (await asyncio.to_thread(http_get, node, "/healthz"))[1]
                if set(expected) <= set(health.get("nodes", ())):
                    break
                await asyncio.sleep(0.1)
