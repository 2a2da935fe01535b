"""`make conformance-a2a`: the A2A TCK's MUST-level requirements against the A2A gateway, with
a lobby, the echo agent and `lobby a2a serve` started here (docs/conformance.md, "A2A TCK").

    python -m tests.conformance.a2a_tck --tck DIR --tck-python PYTHON

`DIR` is a checkout of the TCK (github.com/a2aproject/a2a-tck, branch 1.0-dev, for A2A 1.0),
`PYTHON` the interpreter of a venv it is installed in (the Makefile makes one). The gateway
serves echo at its origin (`--default-agent`) and takes callers without a token as my_client
(`--anonymous`): the TCK sends no credentials. Exit 1, naming each, if a MUST requirement fails
that EXCLUDED does not list, or one it lists passes; a summary either way.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Final

import httpx

ROOT: Final = Path(__file__).resolve().parents[2]
GET_IT: Final = (
    "git clone -b 1.0-dev https://github.com/a2aproject/a2a-tck /tmp/a2a-tck "
    "&& make conformance-a2a A2A_TCK=/tmp/a2a-tck"
)

EXCLUDED: Final = {
    "DM-ART-001": "artifacts of text, file and fixed data parts: the gateway's artifact is "
    "the lobby agent's RESPONSE, one data part",
    "DM-MSG-001": "a direct Message answer: every message is a REQUEST, answered as a task",
}
"""MUST requirements the gateway fails by design, each with why (docs/conformance.md)."""

START_TIMEOUT_S: Final = 30.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tck", type=Path, required=True, help="a checkout of the A2A TCK")
    parser.add_argument("--tck-python", required=True, help="the TCK venv's python")
    args = parser.parse_args()
    tck: Path = args.tck.resolve()
    if not (tck / "run_tck.py").is_file() or not (tck / "tests" / "compatibility").is_dir():
        print(f"a2a_tck: {tck} is not a checkout of the A2A TCK 1.0: {GET_IT}", file=sys.stderr)
        return 2
    report = tck / "reports" / "compatibility.json"
    report.unlink(missing_ok=True)  # a report left by an earlier run must not pass for this one
    with tempfile.TemporaryDirectory(prefix="a2a-tck-") as scratch, sut(Path(scratch)) as url:
        print(f"a2a_tck: the gateway at {url}, the TCK from {tck}", flush=True)
        done = subprocess.run(
            [os.path.abspath(args.tck_python), "run_tck.py", "--sut-host", url, "--level", "must"],
            cwd=tck,
            capture_output=True,
            text=True,
            check=False,
        )
    if not report.is_file():
        print(done.stdout[-4000:] + done.stderr[-4000:], file=sys.stderr)
        print("a2a_tck: the TCK wrote no reports/compatibility.json", file=sys.stderr)
        return 1
    tests = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else "(no summary)"
    return verdict(json.loads(report.read_text()), tests)


def verdict(report: dict[str, object], tests: str) -> int:
    """Print the MUST requirements' tally and what is unexpected; the exit status."""
    requirements = report["per_requirement"]
    assert isinstance(requirements, dict)
    must = {key: value for key, value in requirements.items() if value["level"] == "MUST"}
    tally = Counter(value["status"] for value in must.values())
    failed = {key for key, value in must.items() if value["status"] == "FAIL"}
    print(f"A2A TCK, MUST requirements: {dict(sorted(tally.items()))}; tests: {tests}")
    for key in sorted(failed & EXCLUDED.keys()):
        print(f"  excluded  {key}: {EXCLUDED[key]}")
    unexpected = sorted(failed - EXCLUDED.keys())
    for key in unexpected:
        errors = "; ".join(str(error) for error in must[key]["errors"])
        print(f"  FAILED    {key}: {errors[:300]}")
    stale = sorted(key for key in EXCLUDED if must.get(key, {}).get("status") == "PASS")
    for key in stale:
        print(f"  PASSES    {key}: excluded, yet it passes: take it off EXCLUDED")
    return 1 if unexpected or stale else 0


@contextlib.contextmanager
def sut(scratch: Path) -> Iterator[str]:
    """A lobby, the echo agent (asking for input as the TCK expects: tests/conformance/a2a_agent.py)
    and the A2A gateway, each its own process: the gateway's URL."""
    python = sys.executable
    logs = scratch / "logs"
    logs.mkdir()
    with contextlib.ExitStack() as stack:
        lobby_port = free_port()
        lobby_url = f"ws://127.0.0.1:{lobby_port}/"
        stack.enter_context(
            process(
                [python, "-m", "lobby", "serve", "--host", "127.0.0.1"],
                ["--port", str(lobby_port), "--data-dir", str(scratch / "lobby")],
                log=logs / "lobby.log",
            )
        )
        wait_for(f"http://127.0.0.1:{lobby_port}/healthz", logs / "lobby.log")
        env = {"LOBBY_URL": lobby_url}
        stack.enter_context(
            process(
                [python, "-m", "tests.conformance.a2a_agent"], [], log=logs / "echo.log", env=env
            )
        )
        gateway = stack.enter_context(
            process(
                [python, "-m", "lobby", "a2a", "serve", "--agent-id", "a2a_gateway"],
                ["--port", "0", "--lobby", lobby_url],
                ["--default-agent", "echo", "--anonymous", "my_client"],
                log=logs / "gateway.log",
                stdout=subprocess.PIPE,
            )
        )
        assert gateway.stdout is not None
        url = gateway.stdout.readline().split()[2].removesuffix("/agents/<agent")
        # The card answers once echo is registered.
        wait_for(f"{url}/.well-known/agent-card.json", logs / "echo.log")
        yield url


@contextlib.contextmanager
def process(
    *argv: list[str],
    log: Path,
    env: dict[str, str] | None = None,
    stdout: int | IO[str] | None = None,
) -> Iterator[subprocess.Popen[str]]:
    """A process run from the repository (its stderr to `log`), terminated at the end."""
    with log.open("w") as err:
        child = subprocess.Popen(
            [arg for part in argv for arg in part],
            cwd=ROOT,
            env={**os.environ, **(env or {})},
            stdout=stdout if stdout is not None else err,
            stderr=err,
            text=True,
        )
        try:
            yield child
        finally:
            child.terminate()
            try:
                child.wait(10)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()


def wait_for(url: str, log: Path) -> None:
    """Until `url` answers 200; SystemExit (with the log's tail) if it does not in time."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url, timeout=2).status_code == 200:
                return
        time.sleep(0.1)
    raise SystemExit(
        f"a2a_tck: {url} did not answer in {START_TIMEOUT_S:.0f} s:\n{log.read_text()[-2000:]}"
    )


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


if __name__ == "__main__":
    sys.exit(main())
