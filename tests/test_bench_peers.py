"""`make bench-peers`'s pure half: a driver's JSON line read back and the report rendered (the
peers themselves are never installed by the test suite)."""

from __future__ import annotations

import sys
from typing import Any

import orjson
import pytest

from benchmarks.peers import __main__ as peers
from benchmarks.peers import results


def figures(messages: int, seconds: float, broker: float, agents: float) -> dict[str, Any]:
    return {
        "messages": messages,
        "seconds": seconds,
        "broker_cpu_s": broker,
        "agent_cpu_s": agents,
    }


def run(rate_scale: float, cpu_scale: float, p50: float, p99: float) -> dict[str, Any]:
    """A driver's results: 1000 messages per pattern, `rate_scale` times the relay's time."""
    rr = figures(1000, 0.1 * rate_scale, 0.01 * cpu_scale, 0.02 * cpu_scale)
    return {
        "request_response": {**rr, "rtt_p50_ms": p50, "rtt_p99_ms": p99},
        "one_way": figures(1000, 0.05 * rate_scale, 0.005 * cpu_scale, 0.01 * cpu_scale),
    }


def test_parse_reads_the_last_line_of_the_drivers_output() -> None:
    line = orjson.dumps(run(1.0, 1.0, 0.2, 0.5)).decode()
    parsed = results.parse(f"a warning the peer printed\n{line}\n\n")
    assert parsed == run(1.0, 1.0, 0.2, 0.5)


@pytest.mark.parametrize(
    ("stdout", "reason"),
    [
        ("", "printed no results"),
        ("Traceback (most recent call last):", "is not JSON"),
        ("[1, 2]", "not a JSON object"),
        ('{"request_response": {}}', "lack messages, seconds, broker_cpu_s, agent_cpu_s"),
        (orjson.dumps({"request_response": run(1, 1, 1, 1)["one_way"]}).decode(), "one_way"),
        (orjson.dumps({**run(1, 1, 1, 1), "one_way": figures(0, 1, 0, 0)}).decode(), "no messages"),
    ],
)
def test_parse_names_what_is_wrong(stdout: str, reason: str) -> None:
    with pytest.raises(ValueError, match=reason):
        results.parse(stdout)


def test_render_gives_every_figure_as_a_ratio_to_the_relay() -> None:
    out = {
        "relay": run(1.0, 1.0, 0.2, 0.5),
        "lobby": run(1.25, 2.0, 0.3, 1.0),
        "spade": {"not_run": "install failed: no matching distribution for spade"},
        "autogen": run(10.0, 8.0, 2.0, 5.0),
    }
    text = results.render(out)
    rows = {line.split(" | ")[0]: line for line in text.splitlines() if line.startswith("| ")}
    # request/response: 10,000 msgs/s for the relay, 8,000 for the lobby, 1,000 for AutoGen.
    assert "| durable lobby (sqlite) | 8,000 (0.80x) | 0.30 (1.50x) | 1.00 (2.00x) |" in text
    assert "| AutoGen gRPC runtime | 1,000 (0.10x) | 2.00 (10.00x) | 5.00 (10.00x) |" in text
    relay_row = (
        "| dumb websockets relay | 10,000 (1.00x) | 0.20 (1.00x) | 0.50 (1.00x) | 10.0 (1.00x)"
    )
    assert relay_row in text
    # one-way: no RTT columns; broker and agent CPU per message, 8x the relay's for AutoGen.
    assert "| AutoGen gRPC runtime | 2,000 (0.10x) | 40.0 (8.00x) | 80.0 (8.00x) |" in text
    assert "SPADE 4 (XMPP) |" not in "".join(rows)
    assert "spade: not run: install failed: no matching distribution for spade" in text
    for name in results.SYSTEMS:
        assert results.GUARANTEES[name] in text


def test_render_without_the_relay_gives_figures_without_ratios() -> None:
    out = {"relay": {"not_run": "the driver failed: boom"}, "lobby": run(1, 1, 1, 1)}
    text = results.render(out)
    assert "| durable lobby (sqlite) | 10,000 | 1.00 | 1.00 | 10.0 | 20.0 |" in text
    assert "relay: not run: the driver failed: boom" in text


@pytest.mark.parametrize(
    ("script", "reason"),
    [
        (
            "import sys; sys.exit('Error: the peer broke')",
            "the driver failed: Error: the peer broke",
        ),
        ("print('starting'); print('done')", "the driver's last line is not JSON: 'done'"),
    ],
)
def test_a_driver_that_fails_becomes_one_sentence(script: str, reason: str) -> None:
    with pytest.raises(peers.NotRun) as raised:
        peers.drive([sys.executable, "-c", script])
    assert str(raised.value) == reason
