"""The `storm` phase of `python -m benchmarks`: the reconnect storm (issue 34, item 2). A durable
lobby (`lobby serve`, sqlite store, its own data dir) holds N agents with acks, connected from
several client processes (`benchmarks.storm_clients`), each from its own source address (or,
the NAT case, all from one); a share of them (`HELD_SHARE`) is offline with `HELD_EACH`
messages held for each (sent by an acknowledging sender, every one ACCEPTED). Then the lobby is
stopped (SIGTERM, or kill -9) and started again on the same data dir and port, possibly with
other registration limits: every agent reconnects with the SDK's backoff and resumes with its
token. Measured from the signal: until every agent has resumed, until every held message has
arrived (and been ACKed), what was lost or came twice, the restarted lobby's peak RSS and CPU,
and the REGISTERs refused (or dropped unanswered) per agent. Every process started here is
killed at the end of its round, errors included; every wait is bounded."""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import websockets.asyncio.client

from benchmarks import storm_clients, suite
from benchmarks.harness import BenchError, cpu_seconds, free_port, raise_fd_limit, stop_clients

HELD_SHARE = 0.1
"""Agents with messages held for them when the lobby restarts."""
HELD_EACH = 2
"""Messages held for each of them."""
FULL_AGENTS = 20_000
QUICK_AGENTS = 500
FD_SPARE = 500
"""Descriptors the lobby keeps for its store, its listener and the sender: N is at most the
open-file limit less this (the lobby holds one descriptor per agent)."""
SETUP_BOUND = 240.0
"""Seconds the agents may take to register before the restart."""
STORM_BOUND = 90.0
"""Seconds after the signal past which a round ends whatever happens (30 s is the target)."""
CLIENT_PROCESSES = 4
"""Client processes, whatever the source addresses: the NAT rounds are not slowed by fewer."""
TARGET_SECONDS = 30.0
TARGET_REFUSALS = 2


@dataclass(frozen=True)
class Round:
    name: str
    title: str
    signum: int
    sources: int
    """Source addresses the clients use (1: every agent behind one address)."""
    fleet_burst: bool
    """Whether the restarted lobby takes `--registration-burst N` (else the defaults)."""


DEFAULTS_ROUND = "SIGTERM, one address, default limits"
"""The round that shows what the default `--registration-rate` does to a fleet behind one
address (a refusal loop): reported for reference, not judged against the targets."""
ROUNDS = (
    Round("sigterm", "SIGTERM", signal.SIGTERM, 4, True),
    Round("sigkill", "kill -9", signal.SIGKILL, 4, True),
    Round("nat_default", DEFAULTS_ROUND, signal.SIGTERM, 1, False),
    Round("nat_burst", "SIGTERM, one address", signal.SIGTERM, 1, True),
)


class Lobby:
    """`lobby serve` on a port and data dir of its own, restartable with other limits."""

    def __init__(self, directory: Path, agents: int) -> None:
        self.directory, self.port = directory, free_port()
        self.base = [sys.executable, "-m", "lobby", "serve", "--port", str(self.port)]
        self.base += ["--data-dir", str(directory / "data"), "--store", "sqlite"]
        self.base += ["--max-connections", str(agents + 100), "--message-rate", "0"]
        self.base += ["--log-level", "warning"]
        self.log = directory / "lobby.log"
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/"

    def start(self, *limits: str) -> None:
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(
                [*self.base, *limits], stdout=out, stderr=subprocess.STDOUT
            )

    def stop(self, signum: int) -> None:
        assert self.process is not None
        self.process.send_signal(signum)
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)

    def status_kib(self, key: str) -> int:
        """A `VmRSS`/`VmHWM` line of /proc/PID/status, KiB (0 once it has exited)."""
        assert self.process is not None
        try:
            for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
                if line.startswith(key + ":"):
                    return int(line.split()[1])
        except OSError:
            pass
        return 0

    def listening(self, deadline: float) -> float | None:
        """When (time.time()) it first took a TCP connection, None if not by `deadline`."""
        while time.time() < deadline:
            with contextlib.suppress(OSError):
                socket.create_connection(("127.0.0.1", self.port), 1).close()
                return time.time()
            time.sleep(0.02)  # a port refusing connections announces nothing
        return None

    def rate_limited(self) -> int:
        return self.log.read_bytes().count(b"REGISTRATION_RATE_LIMITED")


async def hold_messages(url: str, held: list[str]) -> list[str]:
    """Send `HELD_EACH` TEXTs to each (offline) agent of `held`, as one acknowledging sender;
    the message ids, once an ACCEPTED covers them all."""
    ids = [f"{agent}-{k}" for agent in held for k in range(HELD_EACH)]
    async with asyncio.timeout(60), websockets.asyncio.client.connect(url) as ws:
        await ws.send(storm_clients.register_frame("storm-sender", None))
        token = orjson.loads(await ws.recv())["payload"]["auth_token"]
        for message_id in ids:
            body = {
                "sender_id": "storm-sender",
                "receiver_id": message_id.rsplit("-", 1)[0],
                "message_type": "TEXT",
                "payload": {"content": message_id},
                "message_id": message_id,
                "auth_token": token,
            }
            await ws.send(orjson.dumps(body).decode())
        while True:
            answer = orjson.loads(await ws.recv())
            if answer["message_type"] == "ERROR":
                raise BenchError(f"a held message was refused: {answer['payload']}")
            if answer["message_type"] == "ACCEPTED" and answer["payload"]["message_id"] == ids[-1]:
                return ids  # it covers every one sent before it


def one_round(round_: Round, agents: int) -> dict[str, Any]:
    ids = [f"a{n}" for n in range(agents)]
    held = ids[:: round(1 / HELD_SHARE)]
    sources = [f"127.0.0.{2 + s}" for s in range(round_.sources)]
    processes = CLIENT_PROCESSES
    context = multiprocessing.get_context("spawn")
    with tempfile.TemporaryDirectory(prefix="lobby-storm-") as tmp:
        lobby = Lobby(Path(tmp), agents)
        lobby.start("--registration-rate", "0")  # the fleet first registers unlimited
        pipes, children = [], []
        try:
            for p in range(processes):
                mine = ids[p::processes]
                theirs = [a for a in held if a in set(mine)]
                parent, child = context.Pipe()
                source = sources[p % len(sources)]
                args = ([lobby.url], source, mine, theirs, len(theirs) * HELD_EACH, child)
                children.append(context.Process(target=storm_clients.main, args=args, daemon=True))
                children[-1].start()
                pipes.append(parent)
            answers = [receive(pipe, SETUP_BOUND) for pipe in pipes]
            if any(a[0] != "ready" for a in answers):
                raise BenchError(f"the agents did not register: {answers}")
            expected = asyncio.run(hold_messages(lobby.url, held))
            for pipe in pipes:
                pipe.send(("storm",))
            for pipe in pipes:
                receive(pipe, 10)
            rss_before = lobby.status_kib("VmRSS")
            started = time.time()
            lobby.stop(round_.signum)
            stopped = time.time()
            for pipe in pipes:
                pipe.send(("back",))  # the held agents reconnect too, from now on
            lobby.start(*(("--registration-burst", str(agents)) if round_.fleet_burst else ()))
            listening = lobby.listening(started + STORM_BOUND)
            reports = finish(pipes, started)
            result = measure(reports, expected, started)
            assert lobby.process is not None
            result.update(
                agents=agents,
                held_agents=len(held),
                held=len(expected),
                sources=round_.sources,
                stopped_s=round(stopped - started, 2),
                listening_s=None if listening is None else round(listening - started, 2),
                rss_before_mib=round(rss_before / 1024, 1),
                rss_peak_mib=round(lobby.status_kib("VmHWM") / 1024, 1),
                cpu_s=round(cpu_seconds(lobby.process.pid), 1),
                rate_limited=lobby.rate_limited(),
                limits=f"--registration-burst {agents}" if round_.fleet_burst else "defaults",
            )
            return result
        finally:
            stop_clients(pipes, children)
            lobby.kill()


def receive(pipe: Any, bound: float) -> tuple[str, Any]:
    if not pipe.poll(bound):
        raise BenchError(f"a client process did not answer within {bound:g} s")
    answer: tuple[str, Any] = pipe.recv()
    return answer


def finish(pipes: list[Any], started: float) -> list[dict[str, Any]]:
    """Each process's report: when it has seen everything, or at `STORM_BOUND`."""
    reports: list[dict[str, Any] | None] = [None] * len(pipes)
    while None in reports and time.time() - started < STORM_BOUND:
        for n, pipe in enumerate(pipes):
            if reports[n] is None and pipe.poll(0.05):
                reports[n] = pipe.recv()[1]
    for n, pipe in enumerate(pipes):
        if reports[n] is None:
            pipe.send(("stop",))
            reports[n] = receive(pipe, 30)[1]
    return [r for r in reports if r is not None]


def measure(reports: list[dict[str, Any]], expected: list[str], started: float) -> dict[str, Any]:
    arrived = Counter(m for r in reports for m, _ in r["deliveries"])
    back = {agent for r in reports for agent in r["resumed_ids"]}
    # A message held for an agent that never came back was not lost: it is still held.
    due = {m for m in expected if m.rsplit("-", 1)[0] in back}
    agents = sum(r["agents"] for r in reports)
    resumed = sum(r["resumed"] for r in reports)
    refusals: Counter[str] = Counter()
    for r in reports:
        refusals.update(r["refusals"])
    codes: Counter[str] = Counter()
    closes: Counter[str] = Counter()
    for r in reports:
        codes.update(r["codes"])
        closes.update(r["closes"])
    last = [r["last_resumed"] for r in reports if r["last_resumed"] is not None]
    delivered = [t for r in reports for _, t in r["deliveries"]]
    return {
        "resumed": resumed,
        "all_resumed_s": round(max(last) - started, 2) if resumed == agents else None,
        "all_delivered_s": round(max(delivered) - started, 2)
        if set(expected) <= set(arrived) and delivered
        else None,
        "lost": len(due - set(arrived)),
        "still_held": len(set(expected) - due),
        "duplicated": sum(n - 1 for n in arrived.values()),
        "unexpected": len(set(arrived) - set(expected)),
        "reregistered": sum(len(r["reregistered"]) for r in reports),
        "refused_agents": len(refusals),
        "refused_max": max(refusals.values(), default=0),
        "refused_total": sum(refusals.values()),
        "refusal_codes": dict(codes),
        "closes": dict(closes),
        "unreachable": sum(r["unreachable"] for r in reports),
    }


def storm(plan: suite.Plan) -> dict[str, Any]:
    """Each round of `ROUNDS` once, on a fresh lobby: N = 20,000 agents (500 in a quick run),
    at most the open-file limit less `FD_SPARE`."""
    limit = raise_fd_limit()
    agents = min(QUICK_AGENTS if plan.repeats == 1 else FULL_AGENTS, limit - FD_SPARE)
    results: dict[str, Any] = {"fd_limit": limit}
    for round_ in ROUNDS:
        try:
            results[round_.name] = {"title": round_.title, **one_round(round_, agents)}
        except (BenchError, TimeoutError, OSError) as exc:  # reported, and the phase goes on
            results[round_.name] = {"title": round_.title, "error": repr(exc)[:300]}
        print(f" {round_.name}", end="", flush=True)  # a round takes a minute or two
    return results


def met(row: dict[str, Any]) -> bool:
    """The targets: all resumed within 30 s, nothing lost, no agent refused more than twice."""
    resumed = row.get("all_resumed_s")
    return (
        resumed is not None
        and resumed <= TARGET_SECONDS
        and row["lost"] == 0
        and row["refused_max"] <= TARGET_REFUSALS
    )


def codes(row: dict[str, Any]) -> str:
    """The REGISTERs refused by code, and `dropped`: sent to the closing lobby, unanswered."""
    return ", ".join(f"{n:,} {code}" for code, n in row["refusal_codes"].items()) or "none"


def still_held(row: dict[str, Any]) -> str:
    """Held messages whose agent did not come back within the round: not lost, still held."""
    return f" ({row['still_held']:,})" if row["still_held"] else ""


def render(results: dict[str, Any]) -> str:
    def seconds(value: float | None) -> str:
        return "never" if value is None else f"{value:g} s"

    lines = [
        "| restart | agents (sources) | restarted with | all resumed | all held delivered "
        "| lobby exited / listening again | held / lost / twice (still held) "
        "| refused: agents, most per agent (how) | peak RSS / CPU "
        f"| target (<= {TARGET_SECONDS:g} s, 0 lost, <= {TARGET_REFUSALS} refusals) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, row in results.items():
        if name == "fd_limit":
            continue
        if "error" in row:
            lines.append(f"| {row['title']} | | | | | | | | | failed: {row['error']} |")
            continue
        lines.append(
            f"| {row['title']} | {row['agents']:,} ({row['sources']}) | {row['limits']} "
            f"| {seconds(row['all_resumed_s'])} ({row['resumed']:,}) "
            f"| {seconds(row['all_delivered_s'])} "
            f"| {seconds(row['stopped_s'])} / {seconds(row['listening_s'])} "
            f"| {row['held']:,} / {row['lost']:,} / {row['duplicated']:,}"
            f"{still_held(row)} "
            f"| {row['refused_agents']:,}, {row['refused_max']} ({codes(row)}) "
            f"| {row['rss_peak_mib']:g} MiB / {row['cpu_s']:g} s "
            f"| {'met' if met(row) else 'NOT MET'} |"
        )
    return "\n".join(lines)
