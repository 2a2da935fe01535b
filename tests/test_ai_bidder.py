"""The pydantic-ai bidder, with pydantic-ai's offline TestModel (no network model)."""

from __future__ import annotations

from pydantic_ai import Agent as ModelAgent
from pydantic_ai.models.test import TestModel

from agent_sdk import Agent, BidResponse
from agent_sdk.ai import PydanticAIBidder
from lobby.server import LobbyServer


def model_bidder(agent_id: str, confidence: float, skills: list[str], url: str) -> PydanticAIBidder:
    bid = {"will_bid": True, "confidence": confidence, "proposal": f"{agent_id}'s plan"}
    return PydanticAIBidder(
        agent_id,
        bidder=ModelAgent(TestModel(custom_output_args=bid), output_type=BidResponse),
        executor=ModelAgent(TestModel(custom_output_text=f"done by {agent_id}")),
        skills=skills,
        lobby_url=url,
    )


async def test_model_bidders_compete_and_the_winner_executes(lobby: LobbyServer) -> None:
    async with (
        model_bidder("careful", 0.9, ["brevity"], lobby.url),
        model_bidder("unsure", 0.4, ["brevity"], lobby.url),
        Agent("requester", lobby_url=lobby.url) as requester,
    ):
        result = await requester.auction(
            "Summarize for executives", required_skills=["brevity"], timeout=3
        )
    assert result.success
    assert result.agent_id == "careful"
    assert result.output == "done by careful"
