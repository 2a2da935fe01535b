"""The pure half of `make bench-peers`: a driver's JSON line read back, and the results as the
Markdown tables of BENCHMARKS.md, every figure with its ratio to the relay of the same run."""

from __future__ import annotations

from typing import Any

import orjson

PATTERNS = {
    "request_response": "request/response: N pairs, closed loop (one REQUEST outstanding each)",
    "one_way": "one-way: one sender to one receiver, counted",
}
FIELDS = ("messages", "seconds", "broker_cpu_s", "agent_cpu_s")
SYSTEMS = {
    "relay": "dumb websockets relay",
    "lobby": "durable lobby (sqlite)",
    "spade": "SPADE 4 (XMPP)",
    "autogen": "AutoGen gRPC runtime",
}
"""Every system of the report, in its order."""
GUARANTEES = {
    "relay": "forwards each frame to the connection paired with it: no parsing, no auth, no "
    "store, nothing acknowledged.",
    "lobby": "`lobby serve` as `make bench` runs it: auth tokens on every message, "
    "authorization, conversation tracking, every message in the sqlite store before it is "
    "delivered (kept across a restart, resent until ACKed; these clients send no ACK); only "
    "the rate limits are off.",
    "spade": "SPADE's embedded XMPP server (`spade run`, pyjabber, in-memory database) in its "
    "own process; agents register in-band and log in with a password over a plain local "
    "stream; responders run in a second process (SPADE hands a message to an agent of its "
    "own process directly); messages are held in memory only, no delivery acknowledgement.",
    "autogen": "a GrpcWorkerAgentRuntimeHost in its own process, two GrpcWorkerAgentRuntime "
    "workers (echo agents on one, callers on the other); a REQUEST is `send_message` (an RPC "
    "the host relays), one-way is `publish_message` to a counting agent; no auth, nothing "
    "persisted, no acknowledgement beyond the RPC's answer.",
}


def parse(stdout: str) -> dict[str, Any]:
    """A driver's results: the last line of its standard output. Raises ValueError with a
    sentence naming what is wrong, which the report shows as that peer's reason."""
    lines = [line for line in stdout.splitlines() if line.strip()]
    if not lines:
        raise ValueError("the driver printed no results")
    try:
        result = orjson.loads(lines[-1])
    except orjson.JSONDecodeError:
        raise ValueError(f"the driver's last line is not JSON: {lines[-1][:120]!r}") from None
    if not isinstance(result, dict):
        raise ValueError("the driver's results are not a JSON object")
    for pattern in PATTERNS:
        figures = result.get(pattern)
        if not isinstance(figures, dict):
            raise ValueError(f"the driver's results lack the {pattern} pattern")
        missing = [f for f in FIELDS if not isinstance(figures.get(f), int | float)]
        if missing:
            raise ValueError(f"the driver's {pattern} results lack {', '.join(missing)}")
        if figures["messages"] <= 0 or figures["seconds"] <= 0:
            raise ValueError(f"the driver's {pattern} results count no messages or no time")
    return result


def per_message_us(figures: dict[str, Any], key: str) -> float:
    return 1e6 * float(figures[key]) / float(figures["messages"])


def rate(figures: dict[str, Any]) -> float:
    return float(figures["messages"]) / float(figures["seconds"])


def _cell(value: float, base: float | None, digits: int = 1) -> str:
    ratio = f" ({value / base:.2f}x)" if base else ""
    return f"{value:,.{digits}f}{ratio}"


def table(results: dict[str, Any], pattern: str) -> list[str]:
    """One pattern's rows: each system that ran, then one line per system that did not."""
    rtt = pattern == "request_response"
    header = "| system | msgs/s | "
    header += "RTT p50 ms | RTT p99 ms | " if rtt else ""
    header += "broker CPU us/msg | agent CPU us/msg |"
    lines = [f"#### {PATTERNS[pattern]} (ratios to the relay)", "", header]
    lines.append("|---" * header.count(" | ") + "|---|")
    relay = results.get("relay", {}).get(pattern)
    for name, title in SYSTEMS.items():
        figures = results.get(name, {}).get(pattern)
        if figures is None:
            continue
        cells = [_cell(rate(figures), rate(relay) if relay else None, 0)]
        if rtt:
            for key in ("rtt_p50_ms", "rtt_p99_ms"):
                cells.append(_cell(float(figures[key]), float(relay[key]) if relay else None, 2))
        for key in ("broker_cpu_s", "agent_cpu_s"):
            base = per_message_us(relay, key) if relay else None
            cells.append(_cell(per_message_us(figures, key), base))
        lines.append(f"| {title} | " + " | ".join(cells) + " |")
    return lines


def render(results: dict[str, Any]) -> str:
    """The tables, the systems that did not run (one line each), and how each was set up."""
    lines: list[str] = []
    for pattern in PATTERNS:
        lines += [*table(results, pattern), ""]
    for name in SYSTEMS:
        reason = results.get(name, {}).get("not_run")
        if reason:
            lines.append(f"{name}: not run: {reason}")
    lines.append("")
    lines += [f"- **{SYSTEMS[name]}**: {GUARANTEES[name]}" for name in SYSTEMS]
    return "\n".join(lines)
