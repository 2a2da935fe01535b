"""Servers under test as child processes, their CPU time and memory, and load processes."""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import orjson

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@dataclass
class Server:
    process: subprocess.Popen[bytes]
    port: int

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/"

    def cpu_seconds(self) -> float:
        """User + system CPU of the whole process (every thread, the store writer too)."""
        with open(f"/proc/{self.process.pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS

    def rss_kib(self) -> int:
        with open(f"/proc/{self.process.pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
        return 0


def _wait_listening(port: int, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"server exited with {process.returncode}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
            return
        time.sleep(0.05)
    raise RuntimeError("server did not start listening")


@contextlib.contextmanager
def lobby(store: str = "sqlite", *extra: str) -> Iterator[Server]:
    """`lobby serve` with auth, authorization, conversation tracking and the given store on;
    the abuse limits that a load test trips by design (rates per agent and per address) off."""
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="lobby-bench-") as data:
        command = [
            sys.executable, "-m", "lobby", "serve", "--port", str(port), "--data-dir", data,
            "--store", store, "--log-level", "warning", "--message-rate", "0",
            "--registration-rate", "0", "--max-message-bytes", str(64 * 1024 * 1024),
            "--max-capabilities", "100000", "--mailbox-limit", "1000000", *extra,
        ]  # fmt: skip
        yield from _run(command, port)


@contextlib.contextmanager
def relay() -> Iterator[Server]:
    port = free_port()
    yield from _run([sys.executable, "-m", "benchmarks.relay", str(port)], port)


def _run(command: list[str], port: int) -> Iterator[Server]:
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_listening(port, process)
        yield Server(process, port)
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def health(server: Server) -> dict[str, Any]:
    url = f"http://127.0.0.1:{server.port}/healthz"
    with urllib.request.urlopen(url, timeout=5) as response:
        body: dict[str, Any] = orjson.loads(response.read())
    return body


def peak_rss_during(server: Server, work: Callable[[], Any]) -> tuple[int, int, Any]:
    """(RSS before, highest RSS while `work()` ran, its result), sampled 4 times a second."""
    before = server.rss_kib()
    peak = [before]
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.25):
            peak.append(server.rss_kib())

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        result = work()
    finally:
        done.set()
        sampler.join()
    return before, max(peak), result


def _child(target: Callable[..., Any], args: tuple[Any, ...], results: Any) -> None:
    from benchmarks.load import run

    results.put(run(target(*args)))


def in_processes(target: Callable[..., Any], args_list: list[tuple[Any, ...]]) -> list[Any]:
    """Run the load coroutine `target(*args)` once per args, each in its own process, at once."""
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    children = [context.Process(target=_child, args=(target, a, results)) for a in args_list]
    for child in children:
        child.start()
    collected = [results.get(timeout=600) for _ in children]
    for child in children:
        child.join(30)
    return collected


def measured(server: Server, target: Callable[..., Any], *args: Any) -> dict[str, Any]:
    """One load process against `server`, with the server's CPU time per routed message."""
    cpu = server.cpu_seconds()
    (result,) = in_processes(target, [args])
    cpu = server.cpu_seconds() - cpu
    messages = result.get("round_trips", 0) * 2
    result["server_cpu_us_per_message"] = cpu * 1e6 / messages if messages else 0.0
    return dict(result)
