"""An agent in Go: examples/go (the standard library and a minimal WebSocket client, written
from PROTOCOL.md alone) against a real lobby and SDK agents, run twice as written: the first run
registers, the second resumes with the token it kept. Each run discovers and calls an SDK agent
with its arguments as one object, and serves an SDK caller its `reverse` capability, delivered
in the object form it registered for."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import subprocess
from pathlib import Path

import orjson
import pytest

from agent_sdk import Agent, UnauthorizedError
from examples.go.counterparts import GO_AGENT, call_go_agent
from examples.js.counterparts import Doubler, DoubleRequest
from lobby.server import LobbyServer
from tests.nodejs import ROOT

GO_DIR = ROOT / "examples" / "go"


@pytest.fixture(scope="module")
def go_agent(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The example, built offline with the standard library alone."""
    go = shutil.which("go")
    assert go, "no go on PATH: `make test` installs Debian's golang-go"
    out = tmp_path_factory.mktemp("go")
    env = {
        **os.environ,
        "GOFLAGS": "-mod=mod",
        "GOPROXY": "off",
        "GOTOOLCHAIN": "local",
        "GOCACHE": str(out / "cache"),
        "GOPATH": str(out / "path"),
    }
    for command in (["vet", "."], ["build", "-o", str(out / "agent"), "."]):
        done = subprocess.run(
            [go, *command], cwd=GO_DIR, env=env, capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 0, f"go {command[0]}: {done.stderr[-3000:]}"
    return out / "agent"


async def test_the_go_agent_calls_and_serves_and_resumes_on_its_second_run(
    lobby: LobbyServer, go_agent: Path, tmp_path: Path
) -> None:
    runs = []
    async with (
        Doubler(lobby_url=lobby.url),
        Agent("go_caller", lobby_url=lobby.url) as caller,
        Agent("intruder", lobby_url=lobby.url) as intruder,
    ):
        for text in ("hello lobby", "again"):
            process = await asyncio.create_subprocess_exec(
                str(go_agent),
                lobby.url,
                cwd=tmp_path,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
            )
            try:
                answer = await call_go_agent(caller, text)
                out, err = await asyncio.wait_for(process.communicate(), 40)
            finally:
                with contextlib.suppress(ProcessLookupError):
                    process.kill()
                await process.wait()
            assert process.returncode == 0, (out + err).decode()
            runs.append((answer, [orjson.loads(line) for line in out.splitlines()]))
        with pytest.raises(UnauthorizedError):
            await intruder.request(GO_AGENT, "reverse", {"text": "x"}, timeout=10)
    (first, steps), (second, again) = runs
    assert first == {"text": "ybbol olleh", "length": 11}
    assert second == {"text": "niaga", "length": 5}
    # `served` comes whenever the caller's REQUEST does: before or after `called`.
    names = [s["step"] for s in steps]
    assert (names[:2], sorted(names[2:4]), names[4:]) == (
        ["registered", "discovered"],
        ["called", "served"],
        ["done"],
    )
    by_name = {s["step"]: s for s in steps}
    assert by_name["registered"]["status"] == "success_registered_finalized"
    assert by_name["discovered"] == {
        "step": "discovered",
        "agent_id": "doubler",
        "input_schema": DoubleRequest.model_json_schema(),
    }
    # Sent as {"arguments": {"n": 21}}: the SDK agent got its flat `n`, and doubled it.
    assert by_name["called"] == {
        "step": "called",
        "agent_id": "doubler",
        "progress": 1,
        "result": {"n": 42},
    }
    assert by_name["served"] == {"step": "served", "requester": "go_caller", "text": "ybbol olleh"}
    assert again[0] == {"step": "registered", "agent_id": GO_AGENT, "status": "success_resumed"}
    assert again[-1] == {"step": "done"}
    assert (tmp_path / f"{GO_AGENT}.token").stat().st_mode & 0o077 == 0
