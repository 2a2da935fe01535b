"""Both A2A bridges against one lobby: an A2A client calls the echo agent through the gateway
(`lobby a2a serve`), and a lobby agent calls a small A2A agent joined with `lobby a2a join`.

    .venv/bin/python -m examples.a2a.run [--lobby-url ws://127.0.0.1:8765/]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import uuid

from agent_sdk import Agent
from examples.echo.echo_agent import EchoAgent

try:
    import httpx
    from a2a.client import ClientConfig, create_client
    from a2a.types import Message, Role, SendMessageRequest
    from google.protobuf.struct_pb2 import Struct

    from bridges.a2a import Gateway, base_url, bind, hashed_tokens, serve_http, serving
    from bridges.a2a_join import A2AAgent, fetch_card
    from bridges.a2a_parts import data_parts, payload_of
    from examples.a2a import shouter
except ModuleNotFoundError as missing:  # the bridges extra, which `make run` leaves out
    package = (missing.name or "a package").split(".")[0]
    raise SystemExit(
        f"examples.a2a needs the bridges extra ({package} is not installed): "
        "make run EXTRAS=bridges, or .venv/bin/pip install -e '.[bridges]'"
    ) from None

TOKEN = "example-secret"  # noqa: S105  # the example's own bearer token, mapped to my_client (echo lets it call)


async def echo_is_online(lobby_url: str) -> bool:
    """Whether an echo agent is running already (`examples.echo.echo_agent`, say): then the
    example calls it rather than starting one that would take its id over."""
    async with Agent("shout_client", lobby_url=lobby_url) as probe:
        offers = await probe.discover("echo")
    return any(offer.agent_id == "echo" and offer.online for offer in offers)


async def call_echo(lobby_url: str) -> list[str]:
    """An A2A client (the official SDK's) sends a message to the lobby's echo capability."""
    echo = (
        contextlib.nullcontext()
        if await echo_is_online(lobby_url)
        else EchoAgent(lobby_url=lobby_url)
    )
    sock = bind("127.0.0.1", 0)
    gateway = Gateway(
        "a2a_gateway", tokens=hashed_tokens({TOKEN: "my_client"}), lobby_url=lobby_url
    )
    headers = {"Authorization": f"Bearer {TOKEN}"}
    async with (
        echo,
        serving(gateway, sock),
        httpx.AsyncClient(headers=headers) as http,
    ):
        # The agent's URL; the SDK reads its card at <url>/.well-known/agent-card.json.
        client = await create_client(
            f"{base_url(sock)}/agents/echo", ClientConfig(httpx_client=http)
        )
        metadata = Struct()
        metadata.update({"skill": "echo"})
        message = Message(
            message_id=uuid.uuid4().hex,
            role=Role.ROLE_USER,
            parts=data_parts({"text": "hi"}),
            metadata=metadata,
        )
        seen: list[str] = []
        async for event in client.send_message(SendMessageRequest(message=message)):
            if event.HasField("status_update") and event.status_update.status.message.parts:
                update = payload_of(list(event.status_update.status.message.parts))
                seen.append(f"echo is working: {update}")
            if event.HasField("artifact_update"):
                answer = payload_of(list(event.artifact_update.artifact.parts))
                seen.append(f"echo answered: {answer['text']!r} ({answer['length']} characters)")
    print("\n".join(f"A2A client: {line}" for line in seen))
    return seen


async def call_shouter(lobby_url: str) -> dict[str, object]:
    """A lobby agent calls an A2A agent joined as lobby agent `shouter`."""
    sock = bind("127.0.0.1", 0)
    async with serve_http(shouter.app(base_url(sock) + "/"), sock), httpx.AsyncClient() as http:
        card = await fetch_card(base_url(sock) + "/.well-known/agent-card.json", http)
        joined = A2AAgent("shouter", card, http, lobby_url=lobby_url)
        async with joined, Agent("shout_client", lobby_url=lobby_url) as me:
            answer: dict[str, object] = await me.request(
                "shouter", "shout", {"text": "hi"}, timeout=10
            )
    print("shouter answered:", answer)
    return answer


async def main(lobby_url: str) -> None:
    await call_echo(lobby_url)
    await call_shouter(lobby_url)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lobby-url", default=os.environ.get("LOBBY_URL", "ws://127.0.0.1:8765/"))
    asyncio.run(main(parser.parse_args().lobby_url))
