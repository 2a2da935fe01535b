"""An agent in another language: examples/js/agent.mjs (Node.js, the `ws` package, written from
PROTOCOL.md alone) against a real lobby and SDK agents. It registers a capability with an
input_schema, discovers and calls an SDK agent, serves an SDK caller and haggles with an SDK
seller; it prints one JSON line per step, and the test checks each step from both sides."""

from __future__ import annotations

import asyncio
import contextlib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import pytest
from websockets.asyncio.client import connect
from websockets.asyncio.server import ServerConnection, serve
from websockets.exceptions import ConnectionClosed
from websockets.http11 import Response

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
from tests.conftest import make_lobby
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
    lobby: LobbyServer, tmp_path: Path, agent_state_dir: Path
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
    kept = agent_state_dir / "tokens" / lobby.identity / f"{JS_AGENT}.token"
    assert kept.stat().st_mode & 0o077 == 0


async def run_with_counterparts(lobby: LobbyServer, url: str, cwd: Path) -> list[dict[str, Any]]:
    """The Node agent against `url` (the lobby, or a proxy to it), its SDK counterparts on
    `lobby`; its JSON lines, once it is done."""
    async with (
        Doubler(lobby_url=lobby.url) as doubler,
        Seller(lobby_url=lobby.url) as seller,
        Agent("js_caller", lobby_url=lobby.url) as caller,
    ):
        process = await run_js_agent(url, cwd)
        try:
            await call_js_agent(caller, "again")
            out, err = await asyncio.wait_for(process.communicate(), 40)
        finally:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            await process.wait()
        assert process.returncode == 0, (out + err).decode()
        for agent in (doubler, seller, caller):
            await agent.unregister()
    return [orjson.loads(line) for line in out.splitlines()]


@dataclass
class Switchboard:
    """A WebSocket proxy at one address in front of whichever lobby `lobby` names, announcing
    that lobby's identity in its handshake as the lobby does; it keeps the REGISTERs sent."""

    lobby: LobbyServer
    registers: list[dict[str, Any]] = field(default_factory=list)

    def announce(self, _: object, __: object, response: Response) -> Response:
        response.headers["Agent-Lobby-Id"] = self.lobby.identity
        return response

    async def handle(self, agent: ServerConnection) -> None:
        async with connect(self.lobby.url) as upstream:

            async def pipe(source: Any, target: Any, keep: bool) -> None:
                with contextlib.suppress(ConnectionClosed):
                    async for text in source:
                        frame = orjson.loads(text)
                        if keep and frame["message_type"] == "REGISTER":
                            self.registers.append(frame)
                        await target.send(text)
                await target.close()

            await asyncio.gather(pipe(agent, upstream, True), pipe(upstream, agent, False))


async def test_a_token_kept_for_one_lobby_is_never_offered_to_another(
    lobby: LobbyServer, tmp_path: Path, agent_state_dir: Path
) -> None:
    """The agent keeps its token under the identity the lobby announces, as the Python SDK
    does, not under the address: another lobby answering at the same address (a proxy that
    switches lobbies) gets a plain REGISTER and issues a token of its own; the first lobby,
    back at that address, resumes the agent with the first token."""
    other = make_lobby(tmp_path / "other-lobby", transport=lobby.settings.transport)
    await other.start()
    switchboard = Switchboard(lobby)
    try:
        async with serve(
            switchboard.handle, "127.0.0.1", 0, process_response=switchboard.announce
        ) as proxy:
            url = f"ws://127.0.0.1:{proxy.sockets[0].getsockname()[1]}/"
            first = await run_with_counterparts(lobby, url, tmp_path)
            switchboard.lobby = other
            second = await run_with_counterparts(other, url, tmp_path)
            switchboard.lobby = lobby
            third = await run_with_counterparts(lobby, url, tmp_path)
    finally:
        await other.stop()
    statuses = [run[0]["status"] for run in (first, second, third)]
    assert statuses == ["success_registered_finalized"] * 2 + ["success_resumed"]
    tokens = agent_state_dir / "tokens"
    token = (tokens / lobby.identity / f"{JS_AGENT}.token").read_text()
    other_token = (tokens / other.identity / f"{JS_AGENT}.token").read_text()
    assert other_token != token
    # The other lobby was offered no token; the first got its own back.
    assert [r.get("auth_token") for r in switchboard.registers] == [None, None, token]
