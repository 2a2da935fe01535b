"""The smallest useful agent: one capability that returns what it is given.

Run a lobby (`make run`), then:  python -m examples.echo.echo_agent
Call it from another agent:      await agent.request("echo", "echo", {"text": "hi"})
"""

from __future__ import annotations

from pydantic import BaseModel

from agent_sdk import Agent, RequestContext, capability


class EchoRequest(BaseModel):
    text: str


class EchoReply(BaseModel):
    text: str
    length: int


class EchoAgent(Agent):
    agent_id = "echo"

    @capability(
        "echo",
        description="Returns the text it is given, with its length.",
        authorized=["my_client", "minimal_client"],  # the README's caller and PROTOCOL.md's
    )
    async def echo(self, request: EchoRequest, ctx: RequestContext) -> EchoReply:
        return EchoReply(text=request.text, length=len(request.text))


if __name__ == "__main__":
    EchoAgent().run_forever()  # lobby_url from $LOBBY_URL, else ws://127.0.0.1:8765/
