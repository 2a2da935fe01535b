"""The README's caller, as a script a test runs (and runs again) in a child process:

    LOBBY_URL=ws://127.0.0.1:PORT/ python -m tests.readme_caller

It prints one JSON line: the answer, and whether this run resumed the agent's registration.
"""

from __future__ import annotations

import asyncio

import orjson
from pydantic import BaseModel

from agent_sdk import Agent


class Answer(BaseModel):
    text: str
    length: int


async def main() -> None:
    async with Agent("my_client") as me:
        services = await me.discover("echo")
        answer = await me.request("echo", "echo", {"text": "hi"}, output_type=Answer, timeout=5)
        resumed = me.stats.resumes == 1
    found = [s.agent_id for s in services]
    print(
        orjson.dumps({"answer": answer.model_dump(), "found": found, "resumed": resumed}).decode()
    )


if __name__ == "__main__":
    asyncio.run(main())
