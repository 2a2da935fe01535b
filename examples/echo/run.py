"""The echo agent and the README's caller in one process: the caller discovers the echo
capability, calls it, and prints the answer.

    .venv/bin/python -m examples.echo.run [--lobby-url ws://127.0.0.1:8765/]
"""

from __future__ import annotations

import argparse
import asyncio
import os

from agent_sdk import Agent
from examples import spread
from examples.echo.echo_agent import EchoAgent, EchoReply


async def main(lobby_url: str) -> EchoReply:
    echo, client = spread(lobby_url, 0), spread(lobby_url, 1)
    async with EchoAgent(lobby_url=echo), Agent("my_client", lobby_url=client) as me:
        services = await me.discover("echo")  # other agents may offer echo too: ask for this one
        print("the echo agent is online:", any(s.agent_id == "echo" and s.online for s in services))
        answer = await me.request("echo", "echo", {"text": "hi"}, output_type=EchoReply, timeout=5)
    print(f"echo answered: {answer.text!r} ({answer.length} characters)")
    return answer


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lobby-url", default=os.environ.get("LOBBY_URL", "ws://127.0.0.1:8765/"))
    asyncio.run(main(parser.parse_args().lobby_url))
