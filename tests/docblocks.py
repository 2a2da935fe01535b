"""The code blocks of README.md and docs/, read and run as a new user runs them.

Conventions (docs/testing.md): a ```python block is a whole program, unless the line before it
is `<!-- not a program -->` (a fragment); a ```text title="Output" block after a program, with
at most some prose between, is what that program prints on stdout, exactly."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from tests.conftest import LobbyProcess

ROOT = Path(__file__).resolve().parent.parent
FRAGMENT = "<!-- not a program -->"
OUTPUT = '```text title="Output"'
AGENT_ID = re.compile(r'^\s+agent_id = "([^"]+)"', re.MULTILINE)


@dataclass(frozen=True)
class Program:
    source: str  # the file it is written in, for messages
    code: str
    output: str | None  # what it prints on stdout, when the text shows it


def python_blocks(path: Path) -> list[tuple[bool, str, str | None]]:
    """Every ```python block of the file: (is a program, its code, its Output block or None)."""
    lines = path.read_text().splitlines(keepends=True)
    blocks = []
    at = 0
    while at < len(lines):
        if lines[at] != "```python\n":
            at += 1
            continue
        whole = at == 0 or lines[at - 1].strip() != FRAGMENT
        end = lines.index("```\n", at + 1)
        code = "".join(lines[at + 1 : end])
        output = None
        after = next((i for i in range(end + 1, len(lines)) if lines[i].startswith("```")), None)
        if after is not None and lines[after].rstrip("\n") == OUTPUT:
            output = "".join(lines[after + 1 : lines.index("```\n", after + 1)])
        blocks.append((whole, code, output))
        at = end + 1
    return blocks


def programs(path: Path) -> list[Program]:
    name = str(path.relative_to(ROOT))
    return [Program(name, code, output) for whole, code, output in python_blocks(path) if whole]


def serves(program: Program) -> bool:
    """An agent that runs until it is stopped, which the callers need running first."""
    return "run_forever()" in program.code


def registered(lobby: LobbyProcess, agent_ids: set[str], after: int) -> bool:
    arrived = {
        e.get("agent_id")
        for e in lobby.events()[after:]
        if e.get("event") in ("AGENT_REGISTERED", "AGENT_RESUMED")
    }
    return agent_ids <= arrived


def run_once(
    lobby: LobbyProcess, programs: list[Program], workdir: Path, env: dict[str, str]
) -> list[subprocess.CompletedProcess[str]]:
    """Each program as a file of its own, `python FILE`: the serving ones started first (and
    waited for until they registered), then the others one after the other; the serving ones
    are stopped with SIGINT, as Ctrl-C does, and must exit 0. Returns the others' runs."""
    files = {}
    for number, program in enumerate(programs):
        path = workdir / f"block_{number}.py"
        path.write_text(program.code)
        files[program] = path
    servers = [p for p in programs if serves(p)]
    awaited = {agent_id for p in servers for agent_id in AGENT_ID.findall(p.code)}
    seen = len(lobby.events())
    running = [
        subprocess.Popen([sys.executable, str(files[p])], env=env, cwd=workdir, text=True)
        for p in servers
    ]
    try:
        deadline = time.monotonic() + 20
        while not registered(lobby, awaited, seen):
            assert time.monotonic() < deadline, f"{sorted(awaited)} never registered"
            assert all(p.poll() is None for p in running), "an agent program exited"
            time.sleep(0.05)
        done = [
            subprocess.run(
                [sys.executable, str(files[p])],
                env=env,
                cwd=workdir,
                capture_output=True,
                text=True,
                timeout=60,
            )
            for p in programs
            if not serves(p)
        ]
    finally:
        for process in running:
            process.send_signal(signal.SIGINT)
        codes = [process.wait(10) for process in running]
    assert codes == [0] * len(running), "an agent program did not stop cleanly on SIGINT"
    for program, run in zip([p for p in programs if not serves(p)], done, strict=True):
        assert run.returncode == 0, f"{program.source}: {run.stderr}"
        assert "Traceback" not in run.stderr, f"{program.source}: {run.stderr}"
        if program.output is not None:
            # Only what the program prints: the SDK logs nothing on stdout.
            assert run.stdout == program.output, f"{program.source}: {run.stdout!r}"
    return done


SOMEONE_ELSE = """\
from typing import Any

from agent_sdk import Agent, CapabilityError, RequestContext, capability


class SomeoneElse(Agent):
    agent_id = "someone_else"

    @capability("echo", description="Another agent's echo.")
    async def echo(self, request: dict[str, Any], ctx: RequestContext) -> dict[str, Any]:
        raise CapabilityError("someone else's echo was called", code="not_yours")

    @capability("quote", description="Another agent's quote.")
    async def quote(self, request: dict[str, Any], ctx: RequestContext) -> dict[str, Any]:
        raise CapabilityError("someone else's quote was called", code="not_yours")


SomeoneElse().run_forever()
"""
"""An agent a shared lobby already holds, offering what the documents' programs call: a
program that takes whichever provider the lobby lists first meets it and fails."""


@contextmanager
def someone_else(lobby: LobbyProcess, workdir: Path, env: dict[str, str]) -> Iterator[None]:
    """`SOMEONE_ELSE` running against `lobby` for the duration."""
    path = workdir / "someone_else.py"
    path.write_text(SOMEONE_ELSE)
    seen = len(lobby.events())
    process = subprocess.Popen([sys.executable, str(path)], env=env, cwd=workdir, text=True)
    try:
        deadline = time.monotonic() + 20
        while not registered(lobby, {"someone_else"}, seen):
            assert time.monotonic() < deadline, "someone_else never registered"
            assert process.poll() is None, "someone_else exited"
            time.sleep(0.05)
        yield
    finally:
        process.send_signal(signal.SIGINT)
        process.wait(10)


def program_env(lobby: LobbyProcess, state_dir: Path) -> dict[str, str]:
    return {
        **os.environ,
        "LOBBY_URL": lobby.url,
        "AGENT_LOBBY_STATE_DIR": str(state_dir),
        "PYTHONPATH": str(ROOT),
    }
