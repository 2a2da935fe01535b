"""`make bench-peers` = `python -m benchmarks.peers [--pairs N] [--round-trips R] [--one-way M]`:
the relay and the durable lobby (in this venv), then SPADE and AutoGen (each in its own venv
under `.venv-peers/`, created from PyPI on the first run and reused while its requirements
file is unchanged), every one through the same patterns and payloads; prints the tables and
writes benchmarks/results/peers.json. A peer that cannot be installed or run is reported in one
line and the others still run."""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import orjson

from benchmarks import harness, report
from benchmarks.peers import results

HERE = Path(__file__).parent
ROOT = HERE.parent.parent
VENVS = ROOT / ".venv-peers"
DRIVERS = HERE / "drivers"
PEERS = {"spade": "spade_xmpp.py", "autogen": "autogen_grpc.py"}
"""Each peer's driver; its pinned requirements are `<peer>.txt` beside this file."""
INSTALL_TIMEOUT = 900.0
RUN_TIMEOUT = 600.0
OUT = HERE.parent / "results" / "peers.json"


class NotRun(Exception):
    """A system could not be installed or run: the sentence the report shows."""


def tail(text: str) -> str:
    """The last line of a failed command's output, which names the problem."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1][:200] if lines else "no output"


def venv_python(peer: str) -> Path:
    """The peer's venv python, creating the venv and installing its requirements when the
    stamp does not match the requirements file (so a second run reuses it)."""
    venv = VENVS / peer
    python = venv / "bin" / "python"
    wanted = (HERE / f"{peer}.txt").read_text()
    stamp = venv / ".installed"
    if python.exists() and stamp.exists() and stamp.read_text() == wanted:
        return python
    print(f"... installing {peer} into {venv}", flush=True)
    steps = [
        [sys.executable, "-m", "venv", "--clear", str(venv)],
        [str(python), "-m", "pip", "install", "--quiet", "-r", str(HERE / f"{peer}.txt")],
    ]
    for step in steps:
        try:
            done = subprocess.run(step, capture_output=True, text=True, timeout=INSTALL_TIMEOUT)
        except subprocess.TimeoutExpired:
            raise NotRun(f"installing took over {INSTALL_TIMEOUT:g} s") from None
        if done.returncode != 0:
            raise NotRun(f"install failed: {tail(done.stderr or done.stdout)}")
    stamp.write_text(wanted)
    return python


def drive(command: list[str]) -> dict[str, Any]:
    try:
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=RUN_TIMEOUT, cwd=ROOT
        )
    except subprocess.TimeoutExpired:
        raise NotRun(f"the driver did not finish within {RUN_TIMEOUT:g} s") from None
    if done.returncode != 0:
        raise NotRun(f"the driver failed: {tail(done.stderr)}")
    try:
        return results.parse(done.stdout)
    except ValueError as error:
        raise NotRun(str(error)) from None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.peers", description=__doc__)
    parser.add_argument("--pairs", type=int, default=10)
    parser.add_argument("--round-trips", type=int, default=200, help="per pair")
    parser.add_argument("--one-way", type=int, default=5000)
    parser.add_argument("--only", nargs="+", choices=list(results.SYSTEMS))
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    plan = ["--pairs", str(args.pairs), "--round-trips", str(args.round_trips)]
    plan += ["--one-way", str(args.one_way)]
    machine = report.machine()
    print(f"Machine: {report.describe(machine)}", flush=True)
    out: dict[str, Any] = {"machine": machine, "plan": vars(args) | {"out": str(args.out)}}
    out["started"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    ws_driver = [sys.executable, "-m", "benchmarks.peers.drivers.relay_lobby", *plan]
    for name in args.only or results.SYSTEMS:
        print(f"... {name}", flush=True)
        try:
            if name in PEERS:
                python = venv_python(name)
                out[name] = drive([str(python), str(DRIVERS / PEERS[name]), *plan])
            else:
                server = harness.relay() if name == "relay" else harness.lobby("sqlite")
                with server as s:
                    out[name] = drive([*ws_driver, "--url", s.url, "--broker-pid", str(s.pid)])
        except (NotRun, harness.BenchError, OSError) as error:
            out[name] = {"not_run": str(error)}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_bytes(orjson.dumps(out, option=orjson.OPT_INDENT_2))
    print()
    print(results.render(out))
    print(f"\nJSON: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
