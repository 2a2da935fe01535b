"""The Agent Lobby SDK: subclass `Agent`, declare capabilities, run.

    from agent_sdk import Agent, RequestContext, capability

    class Echo(Agent):
        agent_id = "echo"

        @capability("echo", description="Returns what it gets.")
        async def echo(self, request: dict[str, Any], ctx: RequestContext) -> dict[str, Any]:
            return request

    Echo().run_forever()

The exception tree is drawn in `agent_sdk.errors`.
"""

from agent_sdk.agent import Agent, AgentStats, Status
from agent_sdk.auction import AgentBid, BidResponse, TaskResult, TaskRFP
from agent_sdk.bidder import Bidder
from agent_sdk.capability import CapabilitySpec, RequestContext, capability
from agent_sdk.errors import (
    AgentSDKError,
    CapabilityError,
    CapabilityNotFoundError,
    InvalidInputError,
    LobbyError,
    NotConnectedError,
    RegistrationError,
    RemoteError,
    RequestError,
    RequestRefusedError,
    RequestTimeoutError,
    UnauthorizedError,
    UnknownReceiverError,
)
from agent_sdk.market import Order
from agent_sdk.negotiation import DialogueHandle, Move
from protocol.models import Capability, Message, MessageType, ServiceRecord

__all__ = [
    "Agent",
    "AgentBid",
    "AgentSDKError",
    "AgentStats",
    "BidResponse",
    "Bidder",
    "Capability",
    "CapabilityError",
    "CapabilityNotFoundError",
    "CapabilitySpec",
    "DialogueHandle",
    "InvalidInputError",
    "LobbyError",
    "Message",
    "MessageType",
    "Move",
    "NotConnectedError",
    "Order",
    "RegistrationError",
    "RemoteError",
    "RequestContext",
    "RequestError",
    "RequestRefusedError",
    "RequestTimeoutError",
    "ServiceRecord",
    "Status",
    "TaskRFP",
    "TaskResult",
    "UnauthorizedError",
    "UnknownReceiverError",
    "capability",
]
