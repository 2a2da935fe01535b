"""The `faults` phase of `python -m benchmarks`: the cluster's delivery promise (PROTOCOL.md §7,
DESIGN.md "Scale") measured under faults, on real processes. Each scenario starts `lobby nats`
(one server, or a 3-server cluster for R3) and two nodes `lobby serve --cluster` a and b, each
with a data dir of its own; wire-level agents (`benchmarks.fault_clients`) stream numbered TEXTs
between the nodes; a fault is injected mid-stream and healed; then, once every sender's
messages are confirmed and the receivers have been quiet, the run counts what was ACCEPTED,
delivered, lost, repeated (and repeated without `redelivered`), reordered, how long the stream
took to flow again, and whether a node was failed over or stayed unready. Every process started
here is SIGKILLed at the end of its run, errors included; every wait is bounded."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks import suite
from benchmarks.fault_clients import Agent, Receiver, Sender
from benchmarks.fault_rig import START_BOUND, Proc, Rig, answering, http_get, until
from benchmarks.harness import BenchError

RATE = 200.0
"""TEXT messages a second from each sender."""
NATS_DOWN = 3.0
"""Seconds a killed nats-server stays down before it is restarted on its port and store."""
NATS_PAUSE = 5.0
"""Seconds one server of the 3-server cluster stays SIGSTOPped."""
NODE_PAUSE = 15.0
"""Seconds a lobby node stays SIGSTOPped: past the cluster's liveness window (NODE_TTL 3 s
here; the liveness rework waits `DEAD_AFTER`, 10 s, plus the TTL before failing a node over)."""
HELD = 1_500
"""Messages the receiver's old home holds for it when it resumes on the other node: a handover
of about 300 KB, which goes through the object store (as tests/test_cluster_faults.py)."""
STEP_BOUND = 20.0
"""Seconds a node may take to reach its `LOBBY_STOP_AT` step."""
QUIET = 5.0
"""Seconds without a delivery, every sender confirmed and every receiver connected, after which
what was ACCEPTED and not delivered counts as lost."""
KEEP_LOGS = os.environ.get("LOBBY_BENCH_FAULT_LOGS")
"""A directory to copy each run's logs to (`<scenario>-<run>/`), for reading what happened."""
SETTLE_BOUND = 45.0
"""Seconds after the stream ends within which the run ends whatever happens."""


@dataclass(frozen=True)
class Timing:
    lead: float
    """Seconds of steady stream before the fault."""
    tail: float
    """Seconds of stream after the fault is healed."""
    repeats: int


@dataclass
class Stream:
    """The agents of one run and what was injected when."""

    senders: list[Sender]
    receivers: list[Receiver]
    tasks: list[asyncio.Task[None]] = field(default_factory=list)
    before_resume: set[str] = field(default_factory=set)
    """What was delivered before the receivers were made to reconnect (`settle`)."""
    fault_at: float | None = None
    healed_at: float | None = None
    notes: list[str] = field(default_factory=list)

    def start(self, *agents: Agent) -> None:
        for agent in agents:
            self.tasks.append(asyncio.create_task(agent.run()))
            if isinstance(agent, Sender):
                self.tasks.append(asyncio.create_task(agent.produce()))

    async def registered(self, *agents: Agent) -> None:
        if not await until(lambda: all(a.wire.sessions for a in agents), START_BOUND):
            raise BenchError(f"not registered within {START_BOUND:g} s: {agents[0].wire}")

    async def settle(self) -> None:
        """Stop the stream, then wait until every sender is confirmed and the receivers have
        everything ACCEPTED, or have been quiet for `QUIET` seconds while connected. What is
        still missing then: each receiver reconnects (twice: each node in turn) and resumes,
        and what comes only then is counted as stranded, not lost."""
        for sender in self.senders:
            sender.stop.set()
        if not await self._quiet(SETTLE_BOUND):
            self.notes.append(f"not settled within {SETTLE_BOUND:g} s")
        self.before_resume = self.delivered()
        for _ in range(len(self.receivers[0].urls)):
            if self.accepted() <= self.delivered():
                return
            for receiver in self.receivers:
                await receiver.drop()
            await self._quiet(QUIET * 3)

    async def _quiet(self, bound: float) -> bool:
        """Until settled (the docstring above), at most `bound` seconds; whether it did."""
        loop = asyncio.get_running_loop()
        since = time.monotonic()
        deadline = loop.time() + bound
        while loop.time() < deadline:
            await asyncio.sleep(0.1)
            heard = [d.at for r in self.receivers for d in r.deliveries[-1:]]
            quiet = time.monotonic() - max(
                [since, *heard, *(s.last_progress for s in self.senders)]
            )
            settled = all(s.done.is_set() for s in self.senders) and all(
                r.connected for r in self.receivers
            )
            if settled and (quiet >= QUIET or (self.accepted() <= self.delivered() and quiet >= 1)):
                return True
        return False

    def accepted(self) -> set[str]:
        return set().union(*(s.accepted for s in self.senders))

    def delivered(self) -> set[str]:
        return {d.message_id for r in self.receivers for d in r.deliveries}

    async def close(self) -> None:
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)

    def measure(self) -> dict[str, Any]:
        """The run's counts (module docstring); times from the fault, in seconds."""
        accepted = self.accepted()
        seen: set[str] = set()
        duplicated = unflagged = reordered = 0
        for receiver in self.receivers:
            highest: dict[str, int] = {}
            for d in receiver.deliveries:
                n = int(d.message_id.rsplit("-", 1)[1])
                if d.message_id in seen:
                    duplicated += 1
                    unflagged += not d.redelivered
                    continue
                seen.add(d.message_id)
                if n < highest.get(d.sender, -1):
                    reordered += 1
                highest[d.sender] = max(n, highest.get(d.sender, -1))
        closes: Counter[str] = Counter()
        refusals: Counter[str] = Counter()
        refused: Counter[str] = Counter()
        for agent in [*self.senders, *self.receivers]:
            closes.update({k: v for k, v in agent.wire.closes.items() if k != "1000"})
            refusals.update(agent.wire.refusals)
            if agent.wire.reregistered:
                self.notes.append(f"{agent.agent_id}'s resume answered as a new registration")
        for sender in self.senders:
            refused.update(sender.refused.values())
        return {
            "accepted": len(accepted),
            "delivered": len(seen),
            "lost": len(accepted - seen),
            "stranded": len(accepted & seen - self.before_resume),
            "duplicated": duplicated,
            "duplicated_unflagged": unflagged,
            "reordered": reordered,
            "flowing_s": self._flowing(),
            "confirmed_s": self._confirmed(),
            "healed_s": round(self.healed_at - self.fault_at, 2)
            if self.fault_at is not None and self.healed_at is not None
            else None,
            "unconfirmed": sum(len(s.pending) for s in self.senders),
            "refused": dict(refused),
            "closes": dict(closes),
            "register_refused": dict(refusals),
        }

    def _flowing(self) -> float | None:
        """From the fault until every receiver got a message produced after it."""
        if self.fault_at is None:
            return None
        worst = 0.0
        for sender in self.senders:
            receiver = next(r for r in self.receivers if r.agent_id == sender.receiver)
            fresh = [
                d.at
                for d in receiver.deliveries
                if d.sender == sender.agent_id
                and sender.produced[int(d.message_id.rsplit("-", 1)[1])] >= self.fault_at
            ]
            if not fresh:
                return None
            worst = max(worst, min(fresh) - self.fault_at)
        return round(worst, 2)

    def _confirmed(self) -> float | None:
        """The longest a message went unconfirmed after the fault: for each message covered
        after it, from the fault (or its sending, if later) to its ACCEPTED; ACCEPTED covering
        in order, it is when the senders had caught up (None: one never was covered)."""
        if self.fault_at is None:
            return None
        if any(s.pending for s in self.senders):
            return None
        worst = 0.0
        for sender in self.senders:
            for n, covered in sender.covered.items():
                if covered > self.fault_at:
                    worst = max(worst, covered - max(sender.produced[n], self.fault_at))
        return round(worst, 2)


Fault = Callable[[Rig, list[Proc], list[Proc]], Awaitable[None]]
"""Injects a fault on (servers, nodes) and heals it; returns once healed."""


async def cross(
    rig: Rig, servers: list[Proc], nodes: list[Proc], fault: Fault, t: Timing
) -> Stream:
    """A receiver and a sender on each node, each sender streaming to the other node's
    receiver; `fault` after `t.lead` seconds, the stream on for `t.tail` after its heal."""
    a, b = nodes
    receivers = [Receiver("recv-a", [a.url, b.url]), Receiver("recv-b", [b.url, a.url])]
    senders = [
        Sender("send-a", [a.url, b.url], "recv-b", RATE),
        Sender("send-b", [b.url, a.url], "recv-a", RATE),
    ]
    stream = Stream(senders, receivers)
    stream.start(*receivers)
    await stream.registered(*receivers)
    stream.start(*senders)
    await asyncio.sleep(t.lead)
    stream.fault_at = time.monotonic()
    await fault(rig, servers, nodes)
    stream.healed_at = time.monotonic()
    await asyncio.sleep(t.tail)
    return stream


async def handover(rig: Rig, nodes: list[Proc], victim: Proc, t: Timing) -> Stream:
    """The receiver, offline, is held `HELD` messages on a; it resumes on b while `victim`
    stops itself at its handover step; `victim` is SIGKILLed there, the stream going on."""
    a, b = nodes
    receiver = Receiver("bob", [b.url, a.url])
    sender = Sender("alice", [a.url, b.url], "bob", RATE, burst=HELD)
    stream = Stream([sender], [receiver])
    ws = await receiver.session(a.url)  # registered on a, then offline
    if ws is None:
        raise BenchError(f"bob could not register on a: {receiver.wire}")
    await ws.close()
    stream.start(sender)
    if not await until(lambda: len(sender.covered) >= HELD, START_BOUND):
        raise BenchError(f"{HELD} messages not ACCEPTED within {START_BOUND:g} s")
    stream.start(receiver)
    if await until(victim.stopped, STEP_BOUND):
        stream.fault_at = stream.healed_at = time.monotonic()
        victim.signal(signal.SIGKILL)
    else:
        stream.notes.append(f"{victim.name} never reached its step")
    await asyncio.sleep(t.tail)
    return stream


async def nats_killed(rig: Rig, servers: list[Proc], nodes: list[Proc]) -> None:
    servers[0].kill()
    await asyncio.sleep(NATS_DOWN)
    servers[0].restart()
    await answering(servers[0])


async def nats_paused(rig: Rig, servers: list[Proc], nodes: list[Proc]) -> None:
    servers[0].signal(signal.SIGSTOP)
    await asyncio.sleep(NATS_PAUSE)
    servers[0].signal(signal.SIGCONT)


async def node_killed(rig: Rig, servers: list[Proc], nodes: list[Proc]) -> None:
    nodes[1].kill()


async def node_paused(rig: Rig, servers: list[Proc], nodes: list[Proc]) -> None:
    nodes[1].signal(signal.SIGSTOP)
    await asyncio.sleep(NODE_PAUSE)
    nodes[1].signal(signal.SIGCONT)


def single(fault: Fault) -> Callable[[Rig, Timing], Awaitable[Stream]]:
    """`fault` on two nodes sharing one nats-server."""

    async def run(rig: Rig, t: Timing) -> Stream:
        servers = [rig.nats("nats")]
        await answering(servers[0])
        nodes = await rig.nodes(("a", servers), ("b", servers))
        return await cross(rig, servers, nodes, fault, t)

    return run


def replicated(fault: Fault) -> Callable[[Rig, Timing], Awaitable[Stream]]:
    """`fault` on two R3 nodes of a 3-server NATS cluster, each listing its own server
    first (a on s0, b on s1); the fault hits s0."""

    async def run(rig: Rig, t: Timing) -> Stream:
        s = await rig.nats_cluster()
        nodes = await rig.nodes(("a", s), ("b", [s[1], s[2], s[0]]), replicas=3)
        return await cross(rig, s, nodes, fault, t)

    return run


def handover_killed(step: str, victim: str) -> Callable[[Rig, Timing], Awaitable[Stream]]:
    """Node `victim` ("a", the old home, or "b", the new one) stops itself at `step`."""

    async def run(rig: Rig, t: Timing) -> Stream:
        servers = [rig.nats("nats")]
        await answering(servers[0])
        nodes = await rig.nodes(("a", servers), ("b", servers), stop={victim: step})
        return await handover(rig, nodes, nodes[0 if victim == "a" else 1], t)

    return run


SCENARIOS: dict[str, tuple[str, Callable[[Rig, Timing], Awaitable[Stream]]]] = {
    "nats_killed": (
        f"the only nats-server SIGKILLed, restarted {NATS_DOWN:g} s later",
        single(nats_killed),
    ),
    "r3_server_killed": (
        f"one server of 3 (R3) SIGKILLed, restarted {NATS_DOWN:g} s later",
        replicated(nats_killed),
    ),
    "r3_server_paused": (
        f"one server of 3 (R3) SIGSTOPped {NATS_PAUSE:g} s",
        replicated(nats_paused),
    ),
    "node_killed": ("node b SIGKILLed", single(node_killed)),
    "node_paused": (f"node b SIGSTOPped {NODE_PAUSE:g} s", single(node_paused)),
    "handover_committed": (
        f"old home a SIGKILLed at handover_committed ({HELD:,} held)",
        handover_killed("handover_committed", "a"),
    ),
    "handover_adopted": (
        f"new home b SIGKILLed at handover_adopted ({HELD:,} held)",
        handover_killed("handover_adopted", "b"),
    ),
}


RUN_BOUND = 150.0


async def one_run(
    run: Callable[[Rig, Timing], Awaitable[Stream]], t: Timing, label: str
) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="lobby-faults-") as tmp:
        rig = Rig(Path(tmp))
        stream: Stream | None = None
        try:
            async with asyncio.timeout(RUN_BOUND):
                stream = await run(rig, t)
                await stream.settle()
            result = stream.measure()
            nodes = [p for p in rig.procs if p.name in ("a", "b")]
            result["failed_over"] = sorted(
                {str(e.get("node_id")) for n in nodes for e in n.events()
                 if e.get("event") == "CLUSTER_RECOVERY_STARTED"}
            )  # fmt: skip
            result["unready"] = [
                n.name
                for n in nodes
                if n.process.poll() is None and http_get(n, "/readyz")[0] != 200
            ]
            result["warnings"] = dict(
                Counter(
                    str(e.get("event"))
                    for n in nodes
                    for e in n.events()
                    if e.get("level") in ("warning", "error")
                )
            )
            result["notes"] = stream.notes
            return result
        finally:
            if stream is not None:
                await stream.close()
            rig.close()
            if KEEP_LOGS:
                keep_logs(Path(tmp), Path(KEEP_LOGS) / label)


def keep_logs(directory: Path, to: Path) -> None:
    to.mkdir(parents=True, exist_ok=True)
    for log in directory.glob("*.log"):
        shutil.copy(log, to)


def faults(plan: suite.Plan) -> dict[str, Any]:
    """Each scenario `plan.repeats` times (once in a quick run); per scenario the runs and
    their totals (`total`)."""
    quick = plan.repeats == 1
    t = Timing(lead=1.5, tail=1.5, repeats=1) if quick else Timing(2.0, 2.0, plan.repeats)
    results: dict[str, Any] = {}
    for name, (title, run) in SCENARIOS.items():
        runs = []
        for n in range(t.repeats):
            try:
                runs.append(asyncio.run(one_run(run, t, f"{name}-{n}")))
            except (BenchError, TimeoutError) as exc:  # reported, and the phase goes on
                runs.append({"error": repr(exc)[:300]})
        results[name] = {"title": title, "runs": runs, "total": total(runs)}
    return results


def total(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Counts summed over the runs that ran, times their worst (None: a run never got
    there); the notes say what else happened, and how many runs failed to run at all."""
    failed = [r["error"] for r in runs if "error" in r]
    ran = [r for r in runs if "error" not in r]
    out: dict[str, Any] = {"runs": len(runs)}
    counts = ("accepted", "delivered", "lost", "stranded", "duplicated", "duplicated_unflagged")
    for key in (*counts, "reordered", "unconfirmed"):
        out[key] = sum(r[key] for r in ran)
    for key in ("flowing_s", "confirmed_s"):
        times = [r[key] for r in ran]
        out[key] = None if None in times or not times else max(times)
    out["failed_over"] = sum(bool(r["failed_over"]) for r in ran)
    out["failed_over_nodes"] = sorted({n for r in ran for n in r["failed_over"]})
    refused: Counter[str] = Counter()
    for r in ran:
        refused.update(r["refused"])
    notes = sorted({n for r in ran for n in r["notes"]})
    if out["stranded"]:
        notes.append(
            f"{out['stranded']:,} stranded: delivered only once the receiver was made to "
            "reconnect (its connection stayed open on a node that no longer served it)"
        )
    if out["unconfirmed"]:
        notes.append(f"{out['unconfirmed']:,} never confirmed")
    notes += [f"{count:,} refused ({code})" for code, count in refused.items()]
    unready = [", ".join(r["unready"]) for r in ran if r["unready"]]
    if unready:
        notes.append(f"unready at the end: {'; '.join(unready)} ({len(unready)}/{len(runs)})")
    notes += [f"run failed: {error}" for error in failed]
    out["notes"] = notes
    return out


def render(results: dict[str, Any]) -> str:
    def seconds(value: float | None) -> str:
        return "never" if value is None else f"{value:g} s"

    lines = [
        "| scenario | runs | ACCEPTED | delivered | lost | duplicated (without redelivered) "
        "| reordered | recovered in (worst): delivering again / all confirmed | failed over "
        "| notes |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in results.values():
        r = row["total"]
        over = f" ({', '.join(r['failed_over_nodes'])})" if r["failed_over_nodes"] else ""
        lines.append(
            f"| {row['title']} | {r['runs']} | {r['accepted']:,} | {r['delivered']:,} "
            f"| {r['lost']:,} | {r['duplicated']:,} ({r['duplicated_unflagged']:,}) "
            f"| {r['reordered']:,} | {seconds(r['flowing_s'])} / {seconds(r['confirmed_s'])} "
            f"| {r['failed_over']}/{r['runs']}{over} | {'; '.join(r['notes']) or '-'} |"
        )
    return "\n".join(lines)
