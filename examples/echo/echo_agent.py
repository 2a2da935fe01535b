"""The smallest useful agent: one capability that returns what it is given."""

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
        authorized=["my_client", "minimal_client"],  # only these agents may call it
    )
    async def echo(self, request: EchoRequest, ctx: RequestContext) -> EchoReply:
        await ctx.progress({"step": "measuring"})  # optional: an in_progress RESPONSE
        return EchoReply(text=request.text, length=len(request.text))

    async def on_connected(self) -> None:  # after each REGISTER: say it is up
        print("echo is up: serving echo until Ctrl-C", flush=True)


if __name__ == "__main__":
    EchoAgent().run_forever()  # connects to $LOBBY_URL, else ws://127.0.0.1:8765/
