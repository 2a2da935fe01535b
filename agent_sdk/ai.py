"""A pydantic-ai agent as an Agora bidder (the `ai` extra: `make run EXTRAS=ai`).

The seed's bidder is a pydantic-ai `Agent` whose output is a `BidResponse`; this wraps one so
it bids over the lobby: the model decides `bid()`, and a second agent (or the same model with
text output) produces the work in `execute()`. Any pydantic-ai model works, including the
offline `TestModel` the tests use.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pydantic_ai import Agent as ModelAgent

from agent_sdk.auction import BidResponse, TaskRFP
from agent_sdk.bidder import Bidder


class PydanticAIBidder(Bidder):
    def __init__(
        self,
        agent_id: str,
        *,
        bidder: ModelAgent[Any, BidResponse],
        executor: ModelAgent[Any, str],
        skills: Sequence[str],
        **options: Any,
    ) -> None:
        self.skills = tuple(skills)
        super().__init__(agent_id, **options)
        self.bidder = bidder
        self.executor = executor

    async def bid(self, rfp: TaskRFP) -> BidResponse:
        prompt = f"RFP: {rfp.requirement}\nSkills needed: {rfp.required_skills}"
        return (await self.bidder.run(prompt)).output

    async def execute(self, rfp: TaskRFP, proposal: str) -> str:
        prompt = f"Execute: {rfp.requirement}\nYour approach: {proposal}"
        return (await self.executor.run(prompt)).output
