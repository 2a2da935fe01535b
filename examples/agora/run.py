"""The Agora over a real lobby: three specialists bid on an RFP, the best score wins and
executes it. Bids here are deterministic (skill overlap), no language model involved.

The bids are sealed: the requester's CFP goes to the lobby as one round, the lobby holds each
PROPOSE until all three specialists have answered (or the round's 3 s pass) and reveals them to
the requester together, in an order shuffled by a seed it records. The quickest specialist
gains nothing over the best one. `--open-bids` runs the same auction with one plain CFP each.

    .venv/bin/python -m examples.agora.run [--lobby-url ws://127.0.0.1:8765/] [--open-bids]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
from typing import Any, ClassVar

from agent_sdk import Agent, Bidder, BidResponse, TaskResult, TaskRFP
from examples import spread


class Specialist(Bidder):
    """Bids when it shares a required skill: the more it shares, the more confident."""

    style: ClassVar[str] = ""

    async def bid(self, rfp: TaskRFP) -> BidResponse:
        shared = set(self.skills) & set(rfp.required_skills)
        if rfp.required_skills and not shared:
            return BidResponse(will_bid=False, confidence=0.0, proposal="", reasoning="no match")
        confidence = min(0.95, 0.55 + 0.2 * len(shared))
        return BidResponse(
            will_bid=True,
            confidence=confidence,
            proposal=f"{self.style} using {', '.join(sorted(shared)) or 'general skills'}",
            reasoning=f"{len(shared)} required skill(s) matched",
        )

    async def execute(self, rfp: TaskRFP, proposal: str) -> str:
        return f"[{self.agent_id}] {rfp.requirement}: done as {proposal}"


class Summarizer(Specialist):
    agent_id = "summarizer"
    skills = ("speed", "brevity", "extraction")
    style = "a quick executive summary"


class Analyzer(Specialist):
    agent_id = "analyzer"
    skills = ("thoroughness", "citations", "research", "brevity")
    style = "a deep analysis with sources"


class Writer(Specialist):
    agent_id = "writer"
    skills = ("engagement", "narrative", "storytelling")
    style = "an engaging narrative"


RFP = TaskRFP(
    requirement="Summarize quantum computing advances for executives",
    required_skills=["brevity", "extraction"],
)


async def main(lobby_url: str, rfp: TaskRFP = RFP, **auction: Any) -> TaskResult:
    # With several lobby nodes, the agents alternate between them (`examples.spread`).
    agents = [
        Summarizer(lobby_url=spread(lobby_url, 0)),
        Analyzer(lobby_url=spread(lobby_url, 1)),
        Writer(lobby_url=spread(lobby_url, 2)),
        Agent("requester", lobby_url=spread(lobby_url, 3)),
    ]
    async with contextlib.AsyncExitStack() as stack:
        for agent in agents:
            await stack.enter_async_context(agent)
        result = await agents[-1].auction(rfp, timeout=3, **auction)
        # Leave the lobby, so the example can run again against the same lobby.
        await asyncio.gather(*(agent.unregister() for agent in agents))
    sealed = auction.get("sealed", True)
    print(f"Bids: {'sealed, revealed together' if sealed else 'open, seen as they came'}")
    print(f"Winner: {result.agent_id or '-'}")
    print(f"Output: {result.output or result.error_message}")
    return result


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lobby-url", default=os.environ.get("LOBBY_URL", "ws://127.0.0.1:8765/"))
    parser.add_argument("--open-bids", action="store_true", help="no sealed round")
    arguments = parser.parse_args()
    asyncio.run(main(arguments.lobby_url, sealed=not arguments.open_bids))
