"""The cluster walk-through of docs/cluster.md: the examples, as a user runs them, with their agents
spread over two real `lobby serve --cluster` nodes on one real `nats-server -js`; the failover
example keeps counting while the node of one of its agents is SIGKILLed."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
from pathlib import Path

from tests.natskit import nats_server
from tests.test_cluster_node import node
from tests.test_durability import stop
from tests.waiting import BOUND

EXPECTED = {
    "echo": "echo answered: 'hi' (2 characters)",
    "fipa_haggle": "TRANSACTION_CONFIRMED: b buys {'r': 1} from s at 15.00",
    "marketplace": "bob paid napoli_express 6.60",
    "agora": "Winner: summarizer",
    "failover": "received 20 of 20 ticks, each once, in order",
}
"""Each example (agents alternating between the nodes) and a line its output must hold."""


def example(name: str, lobby_url: str, *extra: str) -> list[str]:
    return [sys.executable, "-m", f"examples.{name}.run", "--lobby-url", lobby_url, *extra]


async def test_the_examples_run_across_nodes_twice_and_survive_a_node_killed(
    tmp_path: Path,
) -> None:
    async with nats_server(tmp_path) as nats:
        a, b = node(tmp_path / "a", nats, "a"), node(tmp_path / "b", nats, "b")
        urls = f"{a.url},{b.url}"
        try:
            for _ in range(2):  # the second run resumes every agent the first left registered
                for name, line in EXPECTED.items():
                    extra = ["--seconds", "2"] if name == "failover" else []
                    done = await asyncio.to_thread(
                        subprocess.run,
                        example(name, urls, *extra),
                        capture_output=True,
                        text=True,
                        timeout=120,
                    )
                    assert done.returncode == 0, (name, done.stdout, done.stderr[-2000:])
                    assert line in done.stdout, (name, done.stdout)
                    assert "LOBBY_ERROR" not in done.stdout + done.stderr, name
            # The ticker starts on a, the tally on b: kill b while the ticks flow.
            running = await asyncio.create_subprocess_exec(
                *example("failover", urls, "--seconds", "6"),
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
            )
            assert running.stdout is not None
            seen: list[str] = []
            async with asyncio.timeout(BOUND):
                while not (seen and seen[-1].startswith("sent 20")):
                    seen.append((await running.stdout.readline()).decode().strip())
            b.signal(signal.SIGKILL)
            out, err = await asyncio.wait_for(running.communicate(), 120)
            text = "\n".join(seen) + "\n" + out.decode()
            assert running.returncode == 0, (text, err.decode()[-2000:])
            assert "tally: connection lost" in text
            assert "tally: resumed (connection 2)" in text
            assert "received 60 of 60 ticks, each once, in order" in text
        finally:
            stop(a)
            stop(b)
