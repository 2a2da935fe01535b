"""The `storm_cluster` phase of `python -m benchmarks`: the reconnect storm on a 2-node cluster
with one node killed (issue 34, item 2). `lobby nats` and two nodes `lobby serve --cluster`, a
and b (each its own port and data dir, `--registration-burst` the fleet), hold N agents with
acks between them, from client processes (`benchmarks.storm_clients`) each homed on one node
and given both addresses, its own first, as the SDK's `lobby_urls`; a share of them
(`storm.HELD_SHARE`, on both nodes) is offline with `storm.HELD_EACH` messages held for each,
sent through b by an acknowledging sender (every one ACCEPTED, so committed by the agent's
home). Then node a is killed (kill -9): its agents reconnect with the SDK's backoff, moving
to b after a failed attempt, and resume there once b has failed a over (the held agents
come back too). Measured from the kill: until every agent of a and every held agent has
resumed, on b, until every held message has arrived (and been ACKed), what was lost or came
twice, b's peak RSS and CPU, the REGISTERs refused per agent (closed with 1013 while the
failover is under way, or dropped), and whether b holds all N at the end. Every process
started here is SIGKILLed at the end of its round, errors included; every wait is bounded."""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import shutil
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks import storm, storm_clients, suite
from benchmarks.fault_rig import Proc, Rig, answering, http_get, nodes_up, until
from benchmarks.harness import BenchError, cpu_seconds, free_port, raise_fd_limit, stop_clients

HOLD_BOUND = 30.0
"""Seconds after the storm within which the survivor must say it holds all N."""
KEEP_LOGS = os.environ.get("LOBBY_BENCH_STORM_LOGS")
"""A directory to copy each round's logs to (`<round>/`), for reading what happened."""
LOG_LEVEL = os.environ.get("LOBBY_BENCH_STORM_LOG_LEVEL", "warning")
"""The nodes' `--log-level` (info logs every REGISTER, resume and resend)."""


@dataclass(frozen=True)
class Round:
    name: str
    title: str
    dead_after: float | None
    """The nodes' `--cluster-dead-after` (None: the default, 10 s)."""


ROUNDS = (
    Round("kill9", "kill -9 node a", None),
    Round("kill9_dead_after_4", "kill -9 node a, failed over sooner", 4.0),
)


def node(rig: Rig, node_id: str, server: Proc, agents: int, round_: Round) -> Proc:
    """`lobby serve --cluster` on a port and data dir of its own, taking the whole fleet."""
    port = free_port()
    command = [sys.executable, "-m", "lobby", "serve", "--port", str(port)]
    command += ["--data-dir", str(rig.directory / node_id), "--node-id", node_id]
    command += ["--cluster", f"nats://127.0.0.1:{server.port}"]
    command += ["--max-connections", str(agents + 100), "--message-rate", "0"]
    command += ["--registration-burst", str(agents), "--log-level", LOG_LEVEL]
    if round_.dead_after is not None:
        command += ["--cluster-dead-after", str(round_.dead_after)]
    rig.procs.append(Proc(node_id, command, rig.directory / f"lobby-{node_id}.log", port))
    return rig.procs[-1]


async def start(rig: Rig, agents: int, round_: Round) -> tuple[Proc, Proc]:
    """NATS, then node a, then b once a answers (as `Rig.nodes`); both once each sees both."""
    server = rig.nats("nats")
    await answering(server, jetstream=True)
    a = node(rig, "a", server, agents, round_)
    await nodes_up(a, expected=["a"])
    b = node(rig, "b", server, agents, round_)
    await nodes_up(a, b, expected=["a", "b"])
    return a, b


def status_kib(proc: Proc, key: str) -> int:
    """A `VmRSS`/`VmHWM` line of /proc/PID/status, KiB (0 once it has exited)."""
    try:
        for line in Path(f"/proc/{proc.process.pid}/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def one_round(round_: Round, agents: int) -> dict[str, Any]:
    ids = [f"a{n}" for n in range(agents)]
    processes = storm.CLIENT_PROCESSES
    shares = [ids[p::processes] for p in range(processes)]
    # A share of each process's agents is held: on the killed node and on the survivor.
    held = [a for mine in shares for a in mine[:: round(1 / storm.HELD_SHARE)]]
    context = multiprocessing.get_context("spawn")
    with tempfile.TemporaryDirectory(prefix="lobby-storm-cluster-") as tmp:
        rig = Rig(Path(tmp))
        pipes, children = [], []
        try:
            victim, survivor = asyncio.run(start(rig, agents, round_))
            homes = [victim, survivor]
            due: set[str] = set()
            on_victim: set[str] = set()
            for p in range(processes):
                # Process p's agents are homed on node p % 2; each lists the other node next.
                home, other = homes[p % 2], homes[1 - p % 2]
                mine = shares[p]
                theirs = mine[:: round(1 / storm.HELD_SHARE)]
                returning = mine if home is victim else theirs
                due.update(returning)
                on_victim.update(mine if home is victim else ())
                parent, child = context.Pipe()
                source = f"127.0.0.{2 + p}"
                expect = len(theirs) * storm.HELD_EACH
                args = ([home.url, other.url], source, mine, theirs, expect, child, returning)
                children.append(context.Process(target=storm_clients.main, args=args, daemon=True))
                children[-1].start()
                pipes.append(parent)
            answers = [storm.receive(pipe, storm.SETUP_BOUND) for pipe in pipes]
            if any(a[0] != "ready" for a in answers):
                raise BenchError(f"the agents did not register: {answers}")
            # One sender on the survivor; its last ACCEPTED covers the messages forwarded to
            # the node about to be killed too (stored there first).
            expected = asyncio.run(storm.hold_messages(survivor.url, held))
            for pipe in pipes:
                pipe.send(("storm",))
            for pipe in pipes:
                storm.receive(pipe, 10)
            rss_before = status_kib(survivor, "VmRSS")
            cpu_before = cpu_seconds(survivor.process.pid)
            started = time.time()
            victim.kill()
            for pipe in pipes:
                pipe.send(("back",))  # the held agents reconnect too, from now on
            reports = storm.finish(pipes, started)
            holding = asyncio.run(until(lambda: online(survivor) >= agents, HOLD_BOUND))
            health = http_get(survivor, "/healthz")[1]
            result = storm.measure(reports, expected, started)
            arrived = {m for r in reports for m, _ in r["deliveries"]}
            lost = sorted(m for m in expected if m not in arrived)
            resumed = {agent for r in reports for agent in r["resumed_ids"]}
            last = [r["last_resumed"] for r in reports if r["last_resumed"] is not None]
            moved: Counter[str] = Counter()
            for r in reports:
                moved.update(r["resumed_on"])
            result.update(
                agents=agents,
                on_killed=len(on_victim),
                due=len(due),
                # Every agent due back (the killed node's, the held ones) resumed, on b.
                all_resumed_s=round(max(last) - started, 2)
                if due <= resumed and moved[victim.url] == 0
                else None,
                resumed_on_survivor=moved[survivor.url],
                held_agents=len(held),
                held=len(expected),
                # Which: a held message not delivered, and whether its agent was on the killed node.
                lost_sample=lost[:10],
                lost_of_killed=sum(m.rsplit("-", 1)[0] in on_victim for m in lost),
                survivor_online=online(survivor),
                survivor_holds_all=holding,
                adopted=health.get("recovered", {}),
                rss_before_mib=round(rss_before / 1024, 1),
                rss_peak_mib=round(status_kib(survivor, "VmHWM") / 1024, 1),
                cpu_s=round(cpu_seconds(survivor.process.pid) - cpu_before, 1),
                limits=f"--registration-burst {agents}"
                + (f", --cluster-dead-after {round_.dead_after:g}" if round_.dead_after else ""),
            )
            return result
        finally:
            stop_clients(pipes, children)
            rig.close()
            if KEEP_LOGS:
                shutil.copytree(
                    rig.directory,
                    Path(KEEP_LOGS) / round_.name,
                    dirs_exist_ok=True,
                    ignore=shutil.ignore_patterns("a", "b", "nats"),
                )


def online(proc: Proc) -> int:
    """The agents connected to node `proc` (its /healthz `agents_online`; 0 if it is silent)."""
    return int(http_get(proc, "/healthz")[1].get("agents_online", 0))


def storm_cluster(plan: suite.Plan) -> dict[str, Any]:
    """Each round of `ROUNDS` once, on a fresh cluster: N = 20,000 agents (500 in a quick run)
    over both nodes, at most the open-file limit less `storm.FD_SPARE`, so the survivor can
    hold them all."""
    limit = raise_fd_limit()
    full = plan.repeats != 1
    agents = min(storm.FULL_AGENTS if full else storm.QUICK_AGENTS, limit - storm.FD_SPARE)
    results: dict[str, Any] = {"fd_limit": limit}
    for round_ in ROUNDS:
        try:
            results[round_.name] = {"title": round_.title, **one_round(round_, agents)}
        except (BenchError, TimeoutError, OSError) as exc:  # reported, and the phase goes on
            results[round_.name] = {"title": round_.title, "error": repr(exc)[:300]}
        print(f" {round_.name}", end="", flush=True)  # a round takes a minute or two
    return results


def met(row: dict[str, Any]) -> bool:
    """The targets: all resumed within 30 s, nothing lost, no agent refused more than twice;
    and the survivor holds every agent."""
    return storm.met(row) and row["survivor_holds_all"]


def render(results: dict[str, Any]) -> str:
    def seconds(value: float | None) -> str:
        return "never" if value is None else f"{value:g} s"

    lines = [
        "| killed | agents (on the killed node) | nodes run with | all resumed on the survivor "
        "| all held delivered | held / lost / twice (still held) "
        "| refused: agents, most per agent (how) | survivor holds | survivor's peak RSS / CPU "
        f"| target (<= {storm.TARGET_SECONDS:g} s, 0 lost, <= {storm.TARGET_REFUSALS} "
        "refusals) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, row in results.items():
        if name == "fd_limit":
            continue
        if "error" in row:
            lines.append(f"| {row['title']} | | | | | | | | | failed: {row['error']} |")
            continue
        lines.append(
            f"| {row['title']} | {row['agents']:,} ({row['on_killed']:,}) | {row['limits']} "
            f"| {seconds(row['all_resumed_s'])} ({row['resumed_on_survivor']:,} of "
            f"{row['due']:,}) "
            f"| {seconds(row['all_delivered_s'])} "
            f"| {row['held']:,} / {row['lost']:,} / {row['duplicated']:,}"
            f"{storm.still_held(row)} "
            f"| {row['refused_agents']:,}, {row['refused_max']} ({storm.codes(row)}) "
            f"| {row['survivor_online']:,} "
            f"| {row['rss_peak_mib']:g} MiB / {row['cpu_s']:g} s "
            f"| {'met' if met(row) else 'NOT MET'} |"
        )
    return "\n".join(lines)
