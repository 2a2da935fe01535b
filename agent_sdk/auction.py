"""The Agora auction: post an RFP, collect bids in parallel, pick a winner, have it execute.

Over the lobby, each bid is a FIPA dialogue: a CFP carrying the RFP to every bidder found by
skill, a PROPOSE with `confidence` and `proposal` as the bid (or a DECLINE), then ACCEPT for the
winner and DECLINE for every other bidder. The winner executes over REQUEST/RESPONSE
(capability `agora_execute`). Bids under `min_confidence` are dropped; the winner has the best
score: `0.6 x confidence + 0.4 x skill match` (the share of required skills it declares), or
the confidence alone when no skills are required. Ties go to the bidder found first.
"""

from __future__ import annotations

import asyncio
from typing import Any
from uuid import UUID, uuid4

from pydantic import BaseModel, Field

from agent_sdk.errors import AgentSDKError
from agent_sdk.negotiation import DialogueHandle, Negotiator

EXECUTE_CAPABILITY = "agora_execute"


class TaskRFP(BaseModel):
    """Request for proposal: a task seeking bids."""

    id: UUID = Field(default_factory=uuid4)
    requirement: str
    required_skills: list[str] = Field(default_factory=list)
    context: dict[str, Any] = Field(default_factory=dict)
    min_confidence: float = 0.5


class AgentBid(BaseModel):
    rfp_id: UUID
    agent_id: str
    confidence: float = Field(ge=0.0, le=1.0)
    proposal: str


class BidResponse(BaseModel):
    """What a bidder decides when asked to bid."""

    will_bid: bool
    confidence: float = Field(ge=0.0, le=1.0)
    proposal: str
    reasoning: str = ""


class TaskResult(BaseModel):
    rfp_id: UUID
    agent_id: str
    success: bool
    output: str
    error_message: str | None = None


def score(bid: AgentBid, skills: list[str], required: list[str]) -> float:
    if not required:
        return bid.confidence
    matched = len(set(skills) & set(required))
    return 0.6 * bid.confidence + 0.4 * matched / len(required)


class Auctioneer(Negotiator):
    """`auction()`; mixed into `Agent`."""

    async def auction(
        self,
        rfp: TaskRFP | str,
        *,
        timeout: float = 5.0,
        min_confidence: float | None = None,
        required_skills: list[str] | None = None,
    ) -> TaskResult:
        """Run the Agora auction for `rfp` over the lobby and return the winner's result."""
        if isinstance(rfp, str):
            rfp = TaskRFP(requirement=rfp)
        updates: dict[str, Any] = {}
        if min_confidence is not None:
            updates["min_confidence"] = min_confidence
        if required_skills is not None:
            updates["required_skills"] = required_skills
        rfp = rfp.model_copy(update=updates)
        bidders = await self.discover(
            EXECUTE_CAPABILITY, keywords=rfp.required_skills or None, timeout=timeout
        )
        if not bidders:
            return _failed(rfp, "No bidders registered")
        skills = {
            b.agent_id: [k for c in b.relevant_capabilities for k in c.keywords] for b in bidders
        }
        collected = await asyncio.gather(
            *(self._collect_bid(rfp, b.agent_id, timeout) for b in bidders)
        )
        dialogues = {handle.counterpart: handle for handle, _ in collected if handle}
        bids = [bid for _, bid in collected if bid is not None]
        valid = [b for b in bids if b.confidence >= rfp.min_confidence]
        winner = (
            max(valid, key=lambda b: score(b, skills[b.agent_id], rfp.required_skills))
            if valid
            else None
        )
        await asyncio.gather(
            *(
                self._close_bid(dialogues[bid.agent_id], won=bid is winner)
                for bid in bids
                if bid.agent_id in dialogues
            )
        )
        if winner is None:
            return _failed(rfp, "No bids met minimum confidence")
        try:
            answer = await self.request(
                winner.agent_id,
                EXECUTE_CAPABILITY,
                {"rfp": rfp.model_dump(mode="json"), "proposal": winner.proposal},
            )
        except AgentSDKError as exc:
            return _failed(rfp, str(exc), agent_id=winner.agent_id)
        return TaskResult(
            rfp_id=rfp.id, agent_id=winner.agent_id, success=True, output=str(answer["output"])
        )

    async def _collect_bid(
        self, rfp: TaskRFP, bidder: str, timeout: float
    ) -> tuple[DialogueHandle | None, AgentBid | None]:
        try:
            dialogue = await self.cfp(
                bidder,
                {"rfp": rfp.model_dump(mode="json"), "role": "buyer"},
                reply_by=timeout,
                dialogue_id=f"{rfp.id}:{bidder}",
            )
            move = await dialogue.next_move(timeout)
        except (TimeoutError, AgentSDKError):
            return None, None
        if move.kind != "PROPOSE":
            return dialogue, None
        proposal = move.payload.get("proposal", {})
        try:
            bid = AgentBid(
                rfp_id=rfp.id,
                agent_id=bidder,
                confidence=proposal.get("confidence", 0.0),
                proposal=str(proposal.get("proposal", "")),
            )
        except ValueError:
            await dialogue.decline("unreadable bid")
            return dialogue, None
        return dialogue, bid

    async def _close_bid(self, dialogue: DialogueHandle, *, won: bool) -> None:
        if won:
            await dialogue.accept()
        else:
            await dialogue.decline("another bid won")


def _failed(rfp: TaskRFP, error: str, *, agent_id: str = "") -> TaskResult:
    return TaskResult(
        rfp_id=rfp.id, agent_id=agent_id, success=False, output="", error_message=error
    )
