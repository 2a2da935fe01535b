"""Servers under test as child processes, what they cost (from /proc), and load processes.

Every server (the lobby or the relay) is its own process; every load generator is another one
(`multiprocessing`, spawned), so a server has a core to itself on a 2-core machine and its CPU
time can be read from `/proc/<pid>/stat` without the load's mixed in. Every wait is bounded: a
server that does not listen within 20 s, or a load process that does not report within its
deadline, fails the run instead of hanging it.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import queue
import resource
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
MAX_MESSAGE_BYTES = 64 * 1024 * 1024


class BenchError(RuntimeError):
    """A server or a load process failed or overran its deadline."""


def raise_fd_limit() -> int:
    """Raise this process's open-file limit to the hard limit (children inherit it)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return hard


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of process `pid`, all of its threads (the store writer too)."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def waited_seconds(pid: int | str = "self") -> float:
    """Time every thread of process `pid` spent runnable but not running, waiting for a core
    (`run_delay` of /proc/<pid>/task/*/schedstat): what a busy machine adds to its latency."""
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(OSError), open(f"/proc/{pid}/task/{tid}/schedstat") as stat:
            total += int(stat.read().split()[1])
    return total / 1e9


def machine_busy_seconds() -> float:
    """CPU time spent by every process on the machine (all cores, idle and iowait excluded):
    less the server's and the load's own, it shows how much else ran during a window."""
    with open("/proc/stat") as stat:
        fields = [int(x) for x in stat.readline().split()[1:]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = fields[:8]
    return (user + nice + system + irq + softirq + steal) / CLOCK_TICKS


class Quiet:
    """Before a measured run, waits for other processes (another test run on this machine,
    say) to leave the cores idle: at most `budget` seconds over the whole benchmark, so
    `make bench` stays bounded; past it, runs go ahead and their `other_cpu_share` shows it."""

    def __init__(self, budget: float, threshold: float = 0.25) -> None:
        self.budget = budget
        self.threshold = threshold
        self.waited = 0.0

    def others_share(self, seconds: float = 0.25) -> float:
        """Cores' worth of CPU used meanwhile by everything (our servers are idle now)."""
        before = machine_busy_seconds()
        time.sleep(seconds)
        return (machine_busy_seconds() - before) / seconds

    def wait(self) -> None:
        while self.budget > 0:
            started = time.monotonic()
            busy = self.others_share()
            if busy < self.threshold:
                return
            spent = time.monotonic() - started
            self.budget -= spent
            self.waited += spent


QUIET = Quiet(budget=60.0)


def thread_cpu_seconds(pid: int) -> dict[int, float]:
    """User + system CPU time of each thread of process `pid`, by thread id."""
    out: dict[int, float] = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(OSError), open(f"/proc/{pid}/task/{tid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
            out[int(tid)] = (int(fields[11]) + int(fields[12])) / CLOCK_TICKS
    return out


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


@dataclass
class Server:
    name: str
    process: subprocess.Popen[bytes]
    port: int

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/"

    def cpu_seconds(self) -> float:
        return cpu_seconds(self.pid)

    def rss_kib(self) -> int:
        return rss_kib(self.pid)


def _wait_listening(port: int, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise BenchError(f"server exited with {process.returncode}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
            return
        time.sleep(0.05)
    raise BenchError("server did not start listening within 20 s")


def lobby_command(
    port: int, data_dir: str, store: str, *extra: str, patches: str = ""
) -> list[str]:
    """`lobby serve` with auth, authorization, conversation tracking and `store` on; off are
    only the abuse limits a load test trips by design (rates per agent and per address).
    `patches`: run it through `benchmarks.patched` with these experimental changes."""
    launcher = ["-m", "benchmarks.patched", patches] if patches else ["-m", "lobby"]
    return [
        sys.executable, *launcher, "serve", "--port", str(port), "--data-dir", data_dir,
        "--store", store, "--log-level", "warning", "--message-rate", "0",
        "--registration-rate", "0", "--discover-rate", "0",
        "--max-message-bytes", str(MAX_MESSAGE_BYTES),
        "--max-capabilities", "100000", "--mailbox-limit", "1000000", *extra,
    ]  # fmt: skip


@contextlib.contextmanager
def lobby(store: str = "sqlite", *extra: str, patches: str = "") -> Iterator[Server]:
    port = free_port()
    name = f"lobby-{store}" + (f"+{patches}" if patches else "")
    with tempfile.TemporaryDirectory(prefix="lobby-bench-") as data:
        command = lobby_command(port, data, store, *extra, patches=patches)
        yield from _run(name, command, port)


@contextlib.contextmanager
def relay(coalesce: bool = False) -> Iterator[Server]:
    port = free_port()
    command = [sys.executable, "-m", "benchmarks.relay", str(port)]
    name = "relay+coalesce" if coalesce else "relay"
    yield from _run(name, [*command, "--coalesce"] if coalesce else command, port)


@contextlib.contextmanager
def relay_picows() -> Iterator[Server]:
    port = free_port()
    yield from _run(
        "relay-picows", [sys.executable, "-m", "benchmarks.relay_picows", str(port)], port
    )


@contextlib.contextmanager
def lobby_from(tree: str, store: str = "sqlite") -> Iterator[Server]:
    """The lobby of another source tree (a checkout of an earlier commit, say), run by this
    venv's Python: `python -m lobby` imports the package from the working directory first."""
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="lobby-bench-") as data:
        command = lobby_command(port, data, store)
        yield from _run(f"lobby {tree}", command, port, cwd=tree)


def _run(name: str, command: list[str], port: int, cwd: str | None = None) -> Iterator[Server]:
    raise_fd_limit()  # the server inherits it: 10,000 connections need as many descriptors
    env = None if cwd is None else {**os.environ, "PYTHONPATH": cwd}
    process = subprocess.Popen(
        command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=cwd, env=env
    )
    try:
        _wait_listening(port, process)
        yield Server(name, process, port)
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


@contextlib.contextmanager
def scraping(server: Server, every: float = 1.0) -> Iterator[dict[str, int]]:
    """GET /metrics from `server` every `every` seconds (as Prometheus would) while the block
    runs; the dict counts the scrapes and the bytes of the last one."""
    url = f"http://127.0.0.1:{server.port}/metrics"
    done = threading.Event()
    counts = {"scrapes": 0, "bytes": 0}

    def scrape() -> None:
        while True:
            with urllib.request.urlopen(url, timeout=5) as response:
                counts["bytes"] = len(response.read())
            counts["scrapes"] += 1
            if done.wait(every):
                return

    thread = threading.Thread(target=scrape, name="scraper", daemon=True)
    thread.start()
    try:
        yield counts
    finally:
        done.set()
        thread.join(10)


def peak_rss_during(server: Server, work: Callable[[], Any]) -> tuple[int, int, Any]:
    """(RSS before, highest RSS while `work()` ran, its result), sampled 10 times a second."""
    before = server.rss_kib()
    peak = [before]
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.1):
            with contextlib.suppress(OSError):
                peak.append(server.rss_kib())

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        result = work()
    finally:
        done.set()
        sampler.join()
    return before, max(peak), result


def _child(target: Callable[..., Any], args: tuple[Any, ...], results: Any, index: int) -> None:
    from benchmarks.load import run

    try:
        results.put((index, run(target(*args)), None))
    except BaseException:
        results.put((index, None, traceback.format_exc()))


def in_processes(
    target: Callable[..., Any], args_list: list[tuple[Any, ...]], timeout: float
) -> list[Any]:
    """Run the load coroutine `target(*args)` once per args, each in its own process, all at
    once; their results in order. Past `timeout` seconds the processes are killed."""
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    children = [
        context.Process(target=_child, args=(target, a, results, i), daemon=True)
        for i, a in enumerate(args_list)
    ]
    for child in children:
        child.start()
    collected: dict[int, Any] = {}
    deadline = time.monotonic() + timeout
    try:
        while len(collected) < len(children):
            try:
                index, result, error = results.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                raise BenchError(f"{target.__name__} did not finish within {timeout:g} s") from None
            if error is not None:
                raise BenchError(f"{target.__name__} failed:\n{error}")
            collected[index] = result
    finally:
        for child in children:
            child.join(5)
            if child.is_alive():
                child.kill()
                child.join()
    return [collected[i] for i in range(len(children))]


def stop_clients(
    pipes: Sequence[Any], children: Sequence[multiprocessing.process.BaseProcess]
) -> None:
    """End a phase's client processes, errors included: each is told ("stop",) on its pipe,
    given 5 s to leave, then killed."""
    for pipe in pipes:
        with contextlib.suppress(OSError):
            pipe.send(("stop",))
    for process in children:
        process.join(5)
        if process.is_alive():
            process.kill()
            process.join()


def one(target: Callable[..., Any], *args: Any, timeout: float) -> dict[str, Any]:
    """One load process; its result."""
    (result,) = in_processes(target, [args], timeout)
    return dict(result)
