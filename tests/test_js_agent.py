"""An agent in another language: examples/js/agent.mjs (Node.js, the `ws` package, written from
PROTOCOL.md alone) against a real lobby and SDK agents. It registers a capability with an
input_schema, discovers and calls an SDK agent, serves an SDK caller and haggles with an SDK
seller; it prints one JSON line per step, and the test checks each step from both sides."""

from __future__ import annotations

import asyncio
import contextlib
import os
from pathlib import Path
from typing import Any

import orjson
import pytest

from agent_sdk import Agent, InvalidInputError, UnauthorizedError
from examples.fipa_haggle.run import Seller
from examples.js.counterparts import (
    JS_AGENT,
    REVERSE,
    Doubler,
    DoubleRequest,
    call_js_agent,
    find_js_agent,
)
from lobby.server import LobbyServer
from tests.nodejs import ROOT, node, npm_installed

JS_DIR = ROOT / "examples" / "js"


async def run_js_agent(lobby_url: str, cwd: Path) -> asyncio.subprocess.Process:
    npm_installed(JS_DIR)
    return await asyncio.create_subprocess_exec(
        node(),
        str(JS_DIR / "agent.mjs"),
        lobby_url,
        cwd=cwd,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "JS_AGENT_TIMEOUT_S": "30"},
    )


async def test_a_nodejs_agent_calls_serves_and_haggles(lobby: LobbyServer, tmp_path: Path) -> None:
    async with (
        Doubler(lobby_url=lobby.url),
        Seller(lobby_url=lobby.url) as seller,
        Agent("js_caller", lobby_url=lobby.url) as caller,
        Agent("intruder", lobby_url=lobby.url) as intruder,
    ):
        process = await run_js_agent(lobby.url, tmp_path)
        try:
            # The refusals first: the agent exits once it has served one call and haggled.
            service = await find_js_agent(caller)
            with pytest.raises(InvalidInputError):
                await caller.request(JS_AGENT, REVERSE, {"text": 5}, timeout=10)
            with pytest.raises(UnauthorizedError):
                await intruder.request(JS_AGENT, REVERSE, {"text": "x"}, timeout=10)
            reversed_ = await call_js_agent(caller, "hello lobby")
            out, err = await asyncio.wait_for(process.communicate(), 40)
            sold = await asyncio.wait_for(seller.confirmed, 5)
        finally:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            await process.wait()
    assert process.returncode == 0, (out + err).decode()
    assert reversed_ == {"text": "ybbol olleh", "length": 11}
    (capability,) = service.relevant_capabilities
    assert capability.input_schema["required"] == ["text"]
    assert capability.output_schema["required"] == ["text", "length"]
    assert capability.authorized_requester_ids == ["js_caller"]

    steps: list[dict[str, Any]] = [orjson.loads(line) for line in out.splitlines()]
    by_name = {step["step"]: step for step in steps}
    assert by_name["registered"] == {
        "step": "registered",
        "agent_id": JS_AGENT,
        "status": "success_registered_finalized",
    }
    assert by_name["discovered"]["agent_id"] == "doubler"
    assert by_name["discovered"]["input_schema"] == DoubleRequest.model_json_schema()
    assert by_name["called"] == {
        "step": "called",
        "agent_id": "doubler",
        "progress": 1,
        "result": {"n": 42},
    }
    assert by_name["served"] == {"step": "served", "requester": "js_caller", "text": "ybbol olleh"}
    haggle = [
        (step["step"], step.get("price"))
        for step in steps
        if step["step"] in {"cfp", "proposal", "counter", "accept", "match_accept"}
    ]
    assert haggle == [
        ("cfp", None),
        ("proposal", 20),
        ("counter", 10),
        ("proposal", 15),
        ("accept", 15),
        ("match_accept", None),
    ]
    transaction = by_name["transaction_confirmed"]["transaction"]
    assert transaction == sold
    assert (transaction["buyer"], transaction["seller"], transaction["amount"]) == (
        JS_AGENT,
        "s",
        "15.00",
    )
    assert transaction["reference"] == by_name["cfp"]["dialogue"]
    assert steps[-1] == {"step": "done"}
    assert "failed" not in by_name


async def test_the_nodejs_agent_resumes_with_its_kept_token(
    lobby: LobbyServer, tmp_path: Path
) -> None:
    """A second run registers the same id: it must resume with the token it kept, not be
    refused with agent_id_taken."""
    statuses = []
    for _ in range(2):
        async with (
            Doubler(lobby_url=lobby.url) as doubler,
            Seller(lobby_url=lobby.url) as seller,
            Agent("js_caller", lobby_url=lobby.url) as caller,
        ):
            process = await run_js_agent(lobby.url, tmp_path)
            try:
                await call_js_agent(caller, "again")
                out, err = await asyncio.wait_for(process.communicate(), 40)
            finally:
                with contextlib.suppress(ProcessLookupError):
                    process.kill()
                await process.wait()
            assert process.returncode == 0, (out + err).decode()
            steps = [orjson.loads(line) for line in out.splitlines()]
            statuses.append(steps[0]["status"])
            assert steps[-1] == {"step": "done"}
            for agent in (doubler, seller, caller):
                await agent.unregister()
    assert statuses == ["success_registered_finalized", "success_resumed"]
    assert (tmp_path / f"{JS_AGENT}.token").stat().st_mode & 0o077 == 0
