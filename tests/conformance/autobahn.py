"""`make conformance-autobahn`: Autobahn|Testsuite's fuzzing client (`wstest -m fuzzingclient`)
against an echo server on each lobby transport and on plain websockets (the control), then each
case's result on a transport compared with the control's (docs/conformance.md).

    python -m tests.conformance.autobahn --wstest PATH [--cases 6.*,7.*] [--out DIR]

Exit 1, with one line per case, where a transport does worse than the control; a summary
table either way. `--wstest` is a command (wstest needs Python 2: `make conformance-autobahn`
builds one under .conformance/).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Final

from tests.conformance.echo import SERVERS

RANK: Final = {"OK": 4, "NON-STRICT": 3, "INFORMATIONAL": 2, "UNIMPLEMENTED": 1, "FAILED": 0}
"""Better is higher. A result Autobahn has no name for here counts as FAILED."""

PASSING: Final = RANK["NON-STRICT"]
"""NON-STRICT below a control's OK is noted, not failed: Autobahn gives it where one of two
allowed behaviours shows (a bad frame failed the connection before the echo of the message
sent just ahead of it, a UTF-8 error caught at the end of a fragment rather than at the byte),
and which one shows depends on how the frames fell into reads: the control's own count moves
between runs."""

KNOWN: Final = {
    ("picows", "7.1.2"): "picows' parser reads one frame ahead and refuses a second close frame "
    "(1002) before the first reaches the transport: only picows can change that",
}
"""Cases where a transport is worse than the control for a reason outside the lobby's code:
listed on every run, they do not fail it. docs/conformance.md says why for each."""

CONTROL: Final = "control"
EXCLUDED: Final = ["12.*", "13.*"]
"""permessage-deflate: no server under test negotiates it (the lobby turns compression off)."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_listening(port: int, process: subprocess.Popen[bytes], timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"the echo server on port {port} exited with {process.returncode}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.05)
    raise SystemExit(f"the echo server on port {port} did not listen within {timeout:g} s")


def run(wstest: list[str], out: Path, cases: list[str]) -> dict[str, dict[str, str]]:
    """Start the echo servers, run the fuzzing client against them all; the behaviour of every
    case, by server."""
    ports = {server: free_port() for server in SERVERS}
    echoes = [
        subprocess.Popen([sys.executable, "-m", "tests.conformance.echo", server, str(port)])
        for server, port in ports.items()
    ]
    try:
        for process, port in zip(echoes, ports.values(), strict=True):
            wait_listening(port, process)
        spec = {
            "outdir": str(out / "reports"),
            "servers": [
                {"agent": server, "url": f"ws://127.0.0.1:{port}"} for server, port in ports.items()
            ],
            "cases": cases,
            "exclude-cases": EXCLUDED,
            "exclude-agent-cases": {},
        }
        out.mkdir(parents=True, exist_ok=True)
        spec_path = out / "fuzzingclient.json"
        spec_path.write_text(json.dumps(spec, indent=2))
        subprocess.run(
            [*wstest, "-m", "fuzzingclient", "-s", str(spec_path)],
            cwd=out,
            check=True,
            stdout=subprocess.DEVNULL,
        )
    finally:
        for process in echoes:
            process.send_signal(signal.SIGTERM)
        for process in echoes:
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
    index = json.loads((out / "reports" / "index.json").read_text())
    return {
        server: {case: str(result["behavior"]) for case, result in index[server].items()}
        for server in SERVERS
    }


def case_key(case: str) -> tuple[int, ...]:
    return tuple(int(part) for part in case.split("."))


def worse_than_control(
    results: dict[str, dict[str, str]],
) -> tuple[list[str], list[str]]:
    """One line per case where a transport's result ranks below the control's: those that fail
    the run, and those that do not (`KNOWN`, or both results `PASSING`)."""
    control = results[CONTROL]
    lines, notes = [], []
    for server, cases in results.items():
        if server == CONTROL:
            continue
        for case in sorted(cases.keys() | control.keys(), key=case_key):
            ours, theirs = cases.get(case, "MISSING"), control.get(case, "MISSING")
            rank, control_rank = RANK.get(ours, 0), RANK.get(theirs, 0)
            if rank >= control_rank:
                continue
            line = f"{server}: case {case}: {ours}, control {theirs}"
            reason = KNOWN.get((server, case))
            if reason is not None:
                notes.append(f"{line} (known: {reason})")
            elif rank >= PASSING:
                notes.append(f"{line} (both pass)")
            else:
                lines.append(line)
    return lines, notes


def table(results: dict[str, dict[str, str]]) -> str:
    names = list(RANK)
    rows = ["| server | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
    for server, cases in results.items():
        counts = [sum(1 for b in cases.values() if b == name) for name in names]
        rows.append(f"| {server} | " + " | ".join(map(str, counts)) + " |")
    return "\n".join(rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--wstest", required=True, help="the command that runs wstest")
    parser.add_argument("--cases", default="*", help="comma-separated case ids or globs")
    parser.add_argument("--out", type=Path, default=Path(".conformance/autobahn"))
    args = parser.parse_args()
    started = time.monotonic()
    results = run(shlex.split(args.wstest), args.out.resolve(), args.cases.split(","))
    print(table(results))
    print(f"{sum(map(len, results.values()))} results in {time.monotonic() - started:.0f} s")
    print(f"reports: {os.path.relpath(args.out / 'reports' / 'index.html')}")
    worse, notes = worse_than_control(results)
    for line in notes + worse:
        print(line)
    if worse:
        print(f"{len(worse)} case(s) worse than the control")
        return 1
    print("no case worse than the control")
    return 0


if __name__ == "__main__":
    sys.exit(main())
