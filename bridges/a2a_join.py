"""An A2A agent as a lobby agent (`lobby a2a join`): its card's skills become capabilities of
one lobby agent, each REQUEST an A2A message to it, each result a RESPONSE.

The REQUEST's payload (without `capability_name`) goes as one data part, with the skill in
`metadata.skill`; status updates that carry parts become `in_progress` RESPONSEs; a completed
task's artifacts (or a direct message reply) become the success payload (`a2a_parts.payload_of`);
a failed or rejected task becomes status `error` with the code its status message carries in a
data part, else `a2a_failed`. A task that stops in input-required asks the requester (`ctx.ask`,
PROTOCOL.md §5.3) what its status message says, and the INPUT's payload goes back to the task as
the next message (its `taskId`), as many times as the A2A agent asks.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlsplit

import httpx
from a2a.client import A2ACardResolver, A2AClientError, Client, ClientConfig, ClientFactory
from a2a.types import AgentCard, Message, Part, Role, SendMessageRequest, TaskState
from google.protobuf.struct_pb2 import Struct

from agent_sdk.agent import Agent
from agent_sdk.capability import CapabilitySpec, RequestContext
from agent_sdk.errors import CapabilityError
from bridges.a2a_parts import data_parts, payload_of

FAILED = "a2a_failed"
"""The code of an error RESPONSE for a task that failed without saying its own code."""
UNREACHABLE = "a2a_unreachable"
"""The code of an error RESPONSE when the A2A agent could not be reached (or stopped answering)."""

_FAILED_STATES = (
    TaskState.TASK_STATE_FAILED,
    TaskState.TASK_STATE_REJECTED,
    TaskState.TASK_STATE_CANCELED,
)


async def fetch_card(card_url: str, http: httpx.AsyncClient) -> AgentCard:
    """The card at `card_url` (the card's own URL, or the agent's base URL)."""
    parts = urlsplit(card_url)
    base = f"{parts.scheme}://{parts.netloc}"
    if parts.path.endswith(".json"):
        return await A2ACardResolver(http, base, parts.path).get_agent_card()
    return await A2ACardResolver(http, card_url.rstrip("/")).get_agent_card()


class A2AAgent(Agent):
    """A lobby agent whose capabilities are the skills of an A2A agent's `card`; `authorized`
    (if any) may call them. Run it like any agent; `http` is closed by its owner."""

    def __init__(
        self,
        agent_id: str,
        card: AgentCard,
        http: httpx.AsyncClient,
        *,
        authorized: Sequence[str] | None = None,
        **options: Any,
    ) -> None:
        super().__init__(agent_id, **options)
        config = ClientConfig(httpx_client=http, streaming=card.capabilities.streaming)
        self._client: Client = ClientFactory(config).create(card)
        self._url = card.supported_interfaces[0].url if card.supported_interfaces else card.name
        for skill in card.skills:
            self.capabilities[skill.id] = CapabilitySpec(
                name=skill.id,
                description=skill.description,
                keywords=tuple(skill.tags),
                authorized=tuple(authorized) if authorized else None,
                timeout=None,
                handler=A2AAgent._call_skill,
                rate_limit=None,
                input_type=None,
                output_type=None,
            )

    async def _call_skill(self, payload: dict[str, Any], ctx: RequestContext) -> dict[str, Any]:
        metadata = Struct()
        metadata.update({"skill": ctx.capability})
        message = Message(
            message_id=uuid.uuid4().hex,
            role=Role.ROLE_USER,
            parts=data_parts(payload),
            metadata=metadata,
        )
        try:
            return await self._send(message, ctx)
        except (A2AClientError, httpx.HTTPError) as exc:
            raise CapabilityError(
                f"the A2A agent at {self._url} cannot be reached: {exc}", code=UNREACHABLE
            ) from None

    async def _send(self, message: Message, ctx: RequestContext) -> dict[str, Any]:
        result: list[Part] = []
        while True:
            asked = await self._turn(message, ctx, result)
            if asked is None:
                return payload_of(result) if result else {}
            question, task_id, context_id = asked
            answer = await ctx.ask(question)
            message = Message(
                message_id=uuid.uuid4().hex,
                role=Role.ROLE_USER,
                parts=data_parts(answer),
                task_id=task_id,
                context_id=context_id,
            )

    async def _turn(
        self, message: Message, ctx: RequestContext, result: list[Part]
    ) -> tuple[dict[str, Any], str, str] | None:
        """Send one message and read the task's events, gathering its artifacts in `result`:
        None once it is done, or what it asks (and its task and context ids) when it stops in
        input-required."""
        async for event in self._client.send_message(SendMessageRequest(message=message)):
            if event.HasField("message"):
                result[:] = list(event.message.parts)
                return None
            if event.HasField("artifact_update"):
                result.extend(event.artifact_update.artifact.parts)
                continue
            status = event.task.status if event.HasField("task") else event.status_update.status
            if event.HasField("task"):
                result[:] = [part for art in event.task.artifacts for part in art.parts] or result
            said = list(status.message.parts)
            if status.state in _FAILED_STATES:
                answer = payload_of(said) if said else {}
                code = answer.get("code")
                error = answer.get("error") or answer.get("text") or "the A2A task failed"
                raise CapabilityError(
                    str(error), code=code if isinstance(code, str) and code else FAILED
                )
            if status.state == TaskState.TASK_STATE_WORKING and said:
                await ctx.progress(payload_of(said))
            if status.state == TaskState.TASK_STATE_INPUT_REQUIRED:
                if event.HasField("task"):
                    ids = event.task.id, event.task.context_id
                else:
                    ids = event.status_update.task_id, event.status_update.context_id
                return (payload_of(said) if said else {}), *ids
        return None
