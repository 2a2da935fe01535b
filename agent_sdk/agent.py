"""`Agent`: the base class an agent subclasses.

Declare capabilities with `@capability`, override the callbacks you need (`on_message`,
`on_cfp`, `on_order_proposal`, ...), then `await agent.run()`, `async with agent:` or
`agent.run_forever()`. The layers, each in its own module:

    AgentCore          core.py         lifecycle, connection, sending, the read loop
                       dispatch.py     what each frame received means (pure, no I/O)
                       reading.py      carrying that out: answers, routes run as tasks
                       policy.py       rate limits, hooks on messages in and out
                       logs.py         the SDK's log (stdlib logging, `agent_sdk` logger)
    Caller             caller.py       request(), request_stream(), discover(), ask_lobby()
    CapabilityServer   serving.py      answering REQUESTs with @capability handlers,
                                       set_authorized()
    Negotiator         negotiation.py  FIPA dialogues (cfp()), typed callbacks
                       dialogue.py     DialogueHandle: moves, next_proposal(), conclude()
    Trader             market.py       TEXT, order proposals, payments, fetch_messages()
    Auctioneer         auction.py      the Agora auction
    Watcher            presence.py     watch(): PRESENCE of a capability's agents or of
                                       named agents, as they come, change and go
"""

from __future__ import annotations

from agent_sdk.auction import Auctioneer
from agent_sdk.market import Trader
from agent_sdk.presence import Watcher
from agent_sdk.serving import CapabilityServer
from agent_sdk.stats import AgentStats, Status


class Agent(Watcher, Auctioneer, Trader, CapabilityServer):
    """Subclass, set `agent_id` (or pass it), declare capabilities, run. Options are in
    `AgentCore.__init__`."""


__all__ = ["Agent", "AgentStats", "Status"]
