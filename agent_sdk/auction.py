"""The Agora auction: post an RFP, collect bids in parallel, pick a winner, have it execute.

Over the lobby, each bid is a FIPA dialogue: a CFP carrying the RFP to every bidder found by
skill, a PROPOSE with `confidence` and `proposal` as the bid (or a DECLINE), then ACCEPT for the
winner and DECLINE for every other bidder. With more than one bidder the CFP is a sealed round
(unless `sealed=False`): the lobby holds the bids and reveals them together, so a fast bidder
gains nothing over a better one. The winner executes over REQUEST/RESPONSE
(capability `agora_execute`). Bids under `min_confidence` are dropped; the winner has the best
score: `0.6 x confidence + 0.4 x skill match` (the share of required skills it declares), or
the confidence alone when no skills are required. Ties go to the bidder found first.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any
from uuid import UUID, uuid4

from pydantic import BaseModel, Field

from agent_sdk.errors import AgentSDKError
from agent_sdk.negotiation import DialogueHandle, Negotiator, RoundBid

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
        sealed: bool = True,
    ) -> TaskResult:
        """Run the Agora auction for `rfp` over the lobby and return the winner's result.
        Bids are collected for `timeout` seconds, in a sealed round when more than one
        bidder is found (`sealed=False`: each bid is seen as it comes); a sealed round lasts
        at most `protocol.fipa.MAX_ROUND_REPLY_BY` (24 h), and a longer `timeout` fails the
        auction before its CFP is sent."""
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
        found = list(skills)
        try:
            answers = await self.cfp(
                found,
                {"rfp": rfp.model_dump(mode="json"), "role": "buyer"},
                reply_by=timeout,
                dialogue_id=str(rfp.id),
                sealed=None if sealed else False,
            )
        except AgentSDKError as exc:
            return _failed(rfp, str(exc))
        # Ties go to the bidder found first, whatever order the bids came or were revealed in.
        offered = sorted(answers.bids, key=lambda answer: found.index(answer.agent_id))
        dialogues: dict[str, DialogueHandle] = {}
        bids = []
        for answer in offered:
            bid = await _read_bid(rfp, answer)
            if bid is not None:
                dialogues[bid.agent_id] = answer.dialogue
                bids.append(bid)
        valid = [b for b in bids if b.confidence >= rfp.min_confidence]
        winner = (
            max(valid, key=lambda b: score(b, skills[b.agent_id], rfp.required_skills))
            if valid
            else None
        )
        await asyncio.gather(
            *(
                self._close_bid(dialogues[bid.agent_id], won=bid is winner, timeout=timeout)
                for bid in bids
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

    async def _close_bid(self, dialogue: DialogueHandle, *, won: bool, timeout: float) -> None:
        if not won:
            await dialogue.decline("another bid won")
            return
        # Accept, and wait for the winner's MATCH_ACCEPT before giving it the task: its moves
        # in the dialogue are over before the execution starts, so none can trail the task's
        # answer (and come after the winner has left, say).
        with contextlib.suppress(AgentSDKError):  # one that does not confirm gets it all the same
            await dialogue.conclude(timeout=timeout)


async def _read_bid(rfp: TaskRFP, answer: RoundBid) -> AgentBid | None:
    """The bid a PROPOSE carries; an unreadable one is declined."""
    proposal = answer.proposal if isinstance(answer.proposal, dict) else {}
    try:
        return AgentBid(
            rfp_id=rfp.id,
            agent_id=answer.agent_id,
            confidence=proposal.get("confidence", 0.0),
            proposal=str(proposal.get("proposal", "")),
        )
    except ValueError:
        await answer.dialogue.decline("unreadable bid")
        return None


def _failed(rfp: TaskRFP, error: str, *, agent_id: str = "") -> TaskResult:
    return TaskResult(
        rfp_id=rfp.id, agent_id=agent_id, success=False, output="", error_message=error
    )
