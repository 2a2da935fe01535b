"""Where the lobby's time per message goes: py-spy on a lobby under the throughput load.

`python -m benchmarks.profile [--server sqlite|picows|memory|relay] [--pairs 10]` starts a
server (picows: the sqlite lobby on the picows transport), drives it with `load.throughput` from
another process, and samples it with `py-spy record --native --threads` (Python and C frames of
every thread). The samples are sorted into where the time goes (websockets framing, the socket
calls, asyncio/uvloop, decode, the router, encode, the store's writer thread, the garbage
collector, waiting for the GIL) and printed as a Markdown table: the share of the server's
sampled CPU and, from the server CPU per message measured in the same window, microseconds per
routed message. The raw samples (folded stacks; speedscope opens them) go to
benchmarks/results/profile-<server>-<pairs>.txt.

A py-spy sample pauses the process while it unwinds the stacks, so the lobby routes somewhat
fewer messages while profiled; the shares are what matter, and the run prints both rates.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import shutil
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from benchmarks import addressed, harness, load

RESULTS = Path(__file__).parent / "results"
GIL_WAIT = "event loop waiting for the GIL (stalled, not CPU)"
GIL_WAIT_STORE = "writer thread waiting for the GIL (not CPU)"
IO_WAIT = "store: fsync/write syscalls (mostly waiting on the disk)"
IDLE = "idle: the writer thread waiting for work (not CPU)"
ORDER = [
    "websockets: read + parse frames (data_received)",
    "websockets: recv() in the handler task",
    "socket read() syscalls (uvloop)",
    "decode (orjson.loads + envelope checks)",
    "router + delivery (auth, conversations, seq, journal)",
    "router: token SHA-256",
    "router: input schema check (InputCheck, jsonschema-rs)",
    "encode (orjson.dumps)",
    "server glue (received, _execute, the transport's callbacks)",
    "send: framing + transport",
    "send: write() syscalls",
    "committer (event-loop side)",
    "asyncio",
    "event loop (uvloop, task switching)",
    "garbage collector",
    "store: SQLite (GIL released)",
    "store: building the batch (Python, holds the GIL)",
    "other",
    IO_WAIT,
    GIL_WAIT,
    GIL_WAIT_STORE,
    IDLE,
]
_WAITS = ("pthread_cond_timedwait", "pthread_cond_wait", "PyThread_acquire_lock_timed", "sem_wait")
_SYSCALLS = ("write", "writev", "send", "sendmsg", "__write", "__send")
_SEND = (
    "LobbyServer._send",
    "LobbyServer._confirm",
    "LobbyServer.end_of_batch",
    "broadcast",
    "Connection.send_data",
)
_KNOWN = ("websockets/", "lobby/", "protocol/", "benchmarks/", "asyncio/", "concurrent/")
_ROOTS = ("lobby/cli.py", "lobby/__main__.py", "asyncio/runners.py", "benchmarks/relay.py")


WAITS = (GIL_WAIT, GIL_WAIT_STORE, IO_WAIT, IDLE)


def _name(frame: str) -> str:
    return frame.split(" (", 1)[0]


def _file(frame: str) -> str:
    """`lobby/server.py` for a Python frame, '' for a native one."""
    if "(" not in frame or ".py:" not in frame:
        return ""
    return frame.rsplit("(", 1)[1].split(":", 1)[0]


def _owner(frames: list[str]) -> tuple[str, str]:
    """(file, function) of the innermost frame in our code, websockets or asyncio: time in
    other modules (enum, threading, C) is charged to whoever called them."""
    for frame in reversed(frames):
        where = _file(frame)
        if where.startswith(_KNOWN):
            return where, _name(frame)
    return "", ""


def _waiting(names: list[str]) -> bool:
    """The innermost real (named) frame is a lock or condition wait."""
    named = [n for n in names if not n.startswith("0x")]
    return bool(named) and named[-1].startswith(_WAITS)


def classify(stack: list[str]) -> str:
    """The category of one sampled stack (root first, the thread as its first element)."""
    thread, frames = stack[0], stack[1:]
    names = [_name(f) for f in frames]
    if _waiting(names):
        if any("SimpleQueue_get" in n for n in names):
            return IDLE
        return GIL_WAIT_STORE if "lobby-store" in thread else GIL_WAIT
    if any(n.startswith("gc_collect") for n in names):
        return "garbage collector"
    leaf = names[-1] if names else ""
    if "lobby-store" in thread:
        if leaf in ("fdatasync", "fsync", "pwrite64", "pwrite", "write"):
            return IO_WAIT
        if any("libsqlite3" in f for f in frames):
            return "store: SQLite (GIL released)"
        return "store: building the batch (Python, holds the GIL)"
    where, func = _owner(frames)
    if any(n.startswith("Committer.") for n in names):
        return "committer (event-loop side)"
    if any(n in _SEND for n in names):
        if where.startswith("protocol/codec.py"):
            return "encode (orjson.dumps)"
        if leaf in _SYSCALLS:
            return "send: write() syscalls"
        return "send: framing + transport"
    if where.startswith("protocol/codec.py"):
        if func in ("encode", "to_dict"):
            return "encode (orjson.dumps)"
        return "decode (orjson.loads + envelope checks)"
    if where.startswith("lobby/core/"):
        if where == "lobby/core/discovery/schemas.py":
            return "router: input schema check (InputCheck, jsonschema-rs)"
        if "hash_token" in names:
            return "router: token SHA-256"
        return "router + delivery (auth, conversations, seq, journal)"
    if where.startswith("lobby/store/"):
        return "committer (event-loop side)"
    if where.startswith("websockets/"):
        if any(n.endswith("data_received") for n in names):
            return "websockets: read + parse frames (data_received)"
        return "websockets: recv() in the handler task"
    if where.startswith(("lobby/server.py", "lobby/transport/")) or (
        where == "benchmarks/relay.py" and func != "main"
    ):
        return "server glue (received, _execute, the transport's callbacks)"
    if not where or where.startswith(_ROOTS):
        if leaf in ("read", "recv", "readv", "__libc_read"):
            return "socket read() syscalls (uvloop)"
        return "event loop (uvloop, task switching)"
    if where.startswith(("asyncio/", "concurrent/")):
        return "asyncio"
    return "other"


def tally(raw: Path) -> Counter[str]:
    counts: Counter[str] = Counter()
    for line in raw.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        if stack and n.isdigit():
            counts[classify(stack.split(";"))] += int(n)
    return counts


def table(counts: Counter[str], us_per_message: float) -> list[str]:
    cpu = sum(n for c, n in counts.items() if c not in WAITS)
    lines = [
        "| where the time goes | samples | % of server CPU | us per routed message |",
        "|---|---|---|---|",
    ]
    for category in ORDER:
        n = counts.get(category, 0)
        if not n:
            continue
        if category in WAITS:
            lines.append(f"| {category} | {n} | ({100 * n / cpu:.1f}) | |")
        else:
            share = n / cpu
            lines.append(f"| {category} | {n} | {100 * share:.1f} | {share * us_per_message:.1f} |")
    lines.append(f"| total CPU samples | {cpu} | 100 | {us_per_message:.1f} |")
    return lines


def thread_names(raw: Path) -> dict[int, str]:
    """Thread id -> Python thread name, from py-spy's `thread (tid): name` stack roots."""
    names: dict[int, str] = {}
    for line in raw.read_text().splitlines():
        root = line.split(";", 1)[0]
        if root.startswith("thread (") and "): " in root:
            tid, name = root[len("thread (") :].split("): ", 1)
            with contextlib.suppress(ValueError):
                names[int(tid, 0)] = name
    return names


@contextlib.contextmanager
def server_for(kind: str) -> Iterator[harness.Server]:
    if kind == "relay":
        with harness.relay() as server:
            yield server
    elif kind == "picows":  # the sqlite lobby on the picows transport
        with harness.lobby("sqlite", "--transport", "picows") as server:
            yield server
    else:
        with harness.lobby(kind) as server:
            yield server


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.profile", description=__doc__)
    parser.add_argument(
        "--server", choices=["sqlite", "picows", "memory", "relay"], default="sqlite"
    )
    parser.add_argument("--pairs", type=int, default=10)
    parser.add_argument("--window", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--rate", type=int, default=100, help="py-spy samples per second")
    parser.add_argument(
        "--schema",
        action="store_true",
        help="REQUESTs to a capability with an input schema (load.schema_throughput)",
    )
    parser.add_argument(
        "--addressed",
        action="store_true",
        help="REQUESTs to global_lobby by capability (addressed.addressed_throughput)",
    )
    parser.add_argument(
        "--register", type=int, metavar="N", help="profile N registrations (4 processes) instead"
    )
    args = parser.parse_args(argv)
    RESULTS.mkdir(parents=True, exist_ok=True)
    what = f"register-{args.register}" if args.register else str(args.pairs)
    what += "-schema" if args.schema else ""
    what += "-addressed" if args.addressed else ""
    routing = load.schema_throughput if args.schema else load.throughput
    if args.addressed:
        routing = addressed.addressed_throughput
    raw = RESULTS / f"profile-{args.server}-{what}.txt"
    harness.QUIET.budget = 120.0
    with server_for(args.server) as server:
        if args.register:
            work = functools.partial(registrations, server, args.register)
        else:
            # Unprofiled first: the rate that py-spy's pauses are compared with.
            plain = harness.one(
                routing, server.url, server.pid, args.pairs, 3.0, args.window, timeout=90
            )
            print(
                f"{args.server}, {args.pairs} pairs, unprofiled: {plain['messages_per_s']:,.0f}"
                f" msgs/s, {plain['server_cpu_us_per_message']:.1f} us/msg"
            )
            work = functools.partial(
                harness.one, routing, server.url, server.pid, args.pairs, args.seconds,
                args.window, 1.0, timeout=args.seconds + 90,
            )  # fmt: skip
        harness.QUIET.wait()
        before = harness.thread_cpu_seconds(server.pid)
        sampler = subprocess.Popen(
            [
                py_spy(), "record", "--pid", str(server.pid), "--rate", str(args.rate),
                "--format", "raw", "--threads", "--native", "--output", str(raw),
            ],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        try:
            sampled = work()
        finally:
            sampler.send_signal(signal.SIGINT)  # py-spy writes its samples and exits
            sampler.wait(60)
        after = harness.thread_cpu_seconds(server.pid)
    us = float(sampled["server_cpu_us_per_message"])
    print(
        f"{args.server}, {what}, while sampled: {sampled['messages_per_s']:,.0f} per second,"
        f" {us:.1f} us of server CPU each"
        + (f"; others' CPU {sampled['other_cpu_share']:.2f} cores" if not args.register else "")
    )
    names = thread_names(raw)
    spent = {
        names.get(tid, str(tid)): round(after[tid] - before.get(tid, 0.0), 2)
        for tid in after
        if after[tid] - before.get(tid, 0.0) > 0
    }
    print(f"server CPU seconds per thread while sampled (/proc): {spent}\n")
    print("\n".join(table(tally(raw), us)))
    print(f"\nfolded stacks (open in https://www.speedscope.app): {raw}")
    return 0


def py_spy() -> str:
    return shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")


def registrations(server: harness.Server, agents: int) -> dict[str, Any]:
    """`agents` idle agents registered from 4 processes; per registration, as `Snapshot.since`
    reports per message."""
    per = agents // 4
    args = [(server.url, server.pid, per, f"reg{p}x", 0.0) for p in range(4)]
    results = harness.in_processes(load.idle_agents, args, 240.0)
    count = sum(r["registered"] for r in results)
    seconds = max(r["finished"] for r in results) - min(r["started"] for r in results)
    cpu = max(r["server_cpu_end"] for r in results) - min(r["server_cpu_start"] for r in results)
    return {
        "messages_per_s": count / seconds,
        "server_cpu_us_per_message": cpu * 1e6 / count,
    }


if __name__ == "__main__":
    sys.exit(main())
