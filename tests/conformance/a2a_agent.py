"""The lobby agent behind the gateway in `make conformance-a2a`: the echo agent, which also
asks for input as the TCK's own system under test does.

The TCK chooses what its system under test does by the messageId of each message: a task whose
first message's id starts with `tck-input-required` waits for input, and each message of that
task whose id starts so asks again; any other completes it. The gateway passes the messageId at
the start of each REQUEST's and INPUT's lobby `message_id` (bridges/a2a_tasks.py), so this agent
asks (`ctx.ask`) while the ids say so and then echoes as examples/echo does.

    python -m tests.conformance.a2a_agent        # connects to $LOBBY_URL
"""

from __future__ import annotations

from agent_sdk import RequestContext, capability
from examples.echo.echo_agent import EchoAgent, EchoReply, EchoRequest

ASKS = "tck-input-required"


class TckEchoAgent(EchoAgent):
    """`echo`, asking for input first while the A2A messages say so."""

    @capability(
        "echo",
        description="Returns the text it is given, with its length.",
        authorized=["my_client", "minimal_client"],
    )
    async def echo(self, request: EchoRequest, ctx: RequestContext) -> EchoReply:
        said = ctx.message.message_id or ""
        text = request.text
        while said.startswith(ASKS):
            answer = await ctx.ask({"question": "more input, please"})
            said = (ctx.answer.message_id or "") if ctx.answer is not None else ""
            text = str(answer.get("text", text))
        return EchoReply(text=text, length=len(text))


if __name__ == "__main__":
    TckEchoAgent().run_forever()
