"""`Bidder`: an agent that answers Agora RFPs. Subclass it, list its `skills`, and write
`bid()` (should I bid, how confident, what approach?) and `execute()` (do the task)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from agent_sdk.agent import Agent
from agent_sdk.auction import EXECUTE_CAPABILITY, BidResponse, TaskRFP
from agent_sdk.capability import RequestContext, capability
from agent_sdk.negotiation import DialogueHandle


class Bidder(Agent):
    skills: Sequence[str] = ()
    """Skill tags: announced as the keywords of `agora_execute`, so auctions find this agent."""

    def __init__(self, agent_id: str | None = None, **options: Any) -> None:
        super().__init__(agent_id, **options)
        spec = self.capabilities[EXECUTE_CAPABILITY]
        self.capabilities[EXECUTE_CAPABILITY] = dataclasses.replace(
            spec, keywords=tuple(self.skills)
        )

    async def bid(self, rfp: TaskRFP) -> BidResponse:
        """Decide whether and how to bid on `rfp`."""
        raise NotImplementedError

    async def execute(self, rfp: TaskRFP, proposal: str) -> str:
        """Do the task this agent won; the return value is the auction's output."""
        raise NotImplementedError

    async def on_cfp(self, dialogue: DialogueHandle, query: dict[str, Any]) -> None:
        if "rfp" not in query:
            await dialogue.decline("not an RFP")
            return
        response = await self.bid(TaskRFP.model_validate(query["rfp"]))
        if not response.will_bid:
            await dialogue.decline(response.reasoning or "not bidding")
            return
        await dialogue.propose(
            {
                "confidence": response.confidence,
                "proposal": response.proposal,
                "reasoning": response.reasoning,
            }
        )

    async def on_accept(self, dialogue: DialogueHandle) -> None:
        await dialogue.match_accept()

    @capability(EXECUTE_CAPABILITY, description="Executes an RFP this agent won.")
    async def _execute(self, request: dict[str, Any], ctx: RequestContext) -> dict[str, Any]:
        rfp = TaskRFP.model_validate(request["rfp"])
        return {"output": await self.execute(rfp, str(request.get("proposal", "")))}
