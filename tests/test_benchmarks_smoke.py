"""Keeps `make bench` working: a second of load against the relay and the lobby. It checks
that both routed messages, not how fast (timings are for BENCHMARKS.md, not for tests)."""

from __future__ import annotations

from benchmarks import harness, load


def test_the_throughput_run_measures_relay_and_lobby() -> None:
    with harness.relay() as relay:
        baseline = harness.measured(relay, load.throughput, relay.url, 1, 0.5, 8)
    with harness.lobby("sqlite") as lobby:
        routed = harness.measured(lobby, load.throughput, lobby.url, 1, 0.5, 8)
    for result in (baseline, routed):
        assert result["round_trips"] > 0
        assert result["messages_per_s"] > 0
        assert result["server_cpu_us_per_message"] > 0
