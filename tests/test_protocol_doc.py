"""PROTOCOL.md's minimal client (section 13), taken from the document itself and run as a
program, as a reader would: against `lobby serve` and the echo example, twice in a row (the
second run must resume with the token the first one kept), and against an echo agent that
reports progress first (the client must print the final answer, not the `in_progress` one).
And what the document says of `message_id` and `in_reply_to`, checked on the router."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import sys
from pathlib import Path

import orjson

from agent_sdk import RequestContext, capability
from examples.echo.echo_agent import EchoAgent, EchoReply, EchoRequest
from lobby.server import LobbyServer
from tests.conftest import start_lobby_process
from tests.routerkit import join, make_router

PROTOCOL_MD = Path(__file__).resolve().parent.parent / "PROTOCOL.md"
ANSWER = {"text": "hi", "length": 2, "status": "success"}


def minimal_client_code() -> str:
    """The one Python code block of section 13."""
    text = PROTOCOL_MD.read_text()
    section = text[text.index("## 13. A whole session") : text.index("## 14. HTTP")]
    (code,) = re.findall(r"```python\n(.*?)```", section, flags=re.DOTALL)
    return str(code)


async def run_minimal_client(script: Path, lobby_url: str) -> dict[str, object]:
    """Run the client as a child process in the script's directory; return what it printed."""
    child = await asyncio.create_subprocess_exec(
        sys.executable,
        str(script),
        cwd=script.parent,
        env={**os.environ, "LOBBY_URL": lobby_url},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(child.communicate(), 30)
    assert child.returncode == 0, err.decode()
    printed: dict[str, object] = orjson.loads(out)
    return printed


async def test_the_minimal_client_runs_twice_against_one_durable_lobby(tmp_path: Path) -> None:
    script = tmp_path / "minimal_client.py"
    script.write_text(minimal_client_code())
    lobby = start_lobby_process(tmp_path / "data")
    tokens = []
    try:
        async with EchoAgent(lobby_url=lobby.url):
            for _ in range(2):
                assert await run_minimal_client(script, lobby.url) == ANSWER
                tokens.append((tmp_path / "minimal_client.token").read_text())
    finally:
        lobby.signal(signal.SIGTERM)
        lobby.wait(10)
    assert tokens[0] == tokens[1], "the second run must resume with the kept token"
    assert (tmp_path / "minimal_client.token").stat().st_mode & 0o077 == 0


class EchoWithProgress(EchoAgent):
    """The echo example, sending an `in_progress` RESPONSE before its answer."""

    @capability("echo", authorized=["minimal_client"])
    async def echo(self, request: EchoRequest, ctx: RequestContext) -> EchoReply:
        await ctx.progress({"echoing": request.text})
        return await super().echo(request, ctx)


async def test_the_minimal_client_prints_the_final_answer_not_progress(
    lobby: LobbyServer, tmp_path: Path
) -> None:
    script = tmp_path / "minimal_client.py"
    script.write_text(minimal_client_code())
    async with EchoWithProgress(lobby_url=lobby.url):
        assert await run_minimal_client(script, lobby.url) == ANSWER


# What PROTOCOL.md says of message_id and in_reply_to (sections 5, 8 and 11), on the router.


def test_a_move_needs_no_message_id_the_lobby_assigns_one() -> None:
    router = make_router()
    buyer, seller = join(router, "b"), join(router, "s")
    buyer.to("s", "CFP", {"query": {"goods": "r"}}, conversation_id="d1")
    cfp = seller.last()
    assert isinstance(cfp["message_id"], str)
    seller.to(
        "b",
        "PROPOSE",
        {"proposal": {"price": 20}},
        conversation_id="d1",
        in_reply_to=cfp["message_id"],
    )
    propose = buyer.last()
    assert propose["message_type"] == "PROPOSE"
    assert propose["in_reply_to"] == cfp["message_id"]


def test_a_refused_move_without_message_id_names_a_lobby_assigned_id() -> None:
    router = make_router()
    buyer, seller = join(router, "b"), join(router, "s")
    buyer.to("s", "ACCEPT", {}, conversation_id="d1")  # a dialogue starts with CFP
    error = buyer.last()
    assert error["payload"]["code"] == "invalid_dialogue"
    assert isinstance(error["in_reply_to"], str)  # an id the sender never saw
    buyer.to("s", "ACCEPT", {}, conversation_id="d2", message_id="mine-1")
    assert buyer.last()["in_reply_to"] == "mine-1"
    assert seller.take() == []


def test_a_response_is_matched_by_conversation_in_reply_to_is_forwarded_as_given() -> None:
    router = make_router()
    caller, callee = join(router, "caller"), join(router, "callee", capabilities=[{"name": "c"}])
    for conversation, reply_fields in (("c1", {}), ("c2", {"in_reply_to": "anything"})):
        caller.to("callee", "REQUEST", {"capability_name": "c"}, conversation_id=conversation)
        callee.last()
        callee.to(
            "caller",
            "RESPONSE",
            {"status": "success"},
            conversation_id=conversation,
            **reply_fields,
        )
        response = caller.last()
        assert response["message_type"] == "RESPONSE"
        assert response.get("in_reply_to") == reply_fields.get("in_reply_to")
