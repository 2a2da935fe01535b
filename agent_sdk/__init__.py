"""The Agent Lobby SDK: subclass `Agent`, declare capabilities, run.

    from agent_sdk import Agent, RequestContext, capability

    class Echo(Agent):
        agent_id = "echo"

        @capability("echo", description="Returns what it gets.")
        async def echo(self, request: dict[str, Any], ctx: RequestContext) -> dict[str, Any]:
            return request

    Echo().run_forever()

The exception tree is drawn in `agent_sdk.errors` (`except AgentSDKError` catches whatever the
SDK raises); how an agent keeps its identity (its token) across restarts is in
`agent_sdk.identity`; rate limits, run-time allow-lists and hooks on messages in `agent_sdk.policy`;
typed negotiation in `agent_sdk.negotiation`; the SDK logs through `logging` (`agent_sdk.logs`)
and prints nothing on stdout.
"""

from agent_sdk.agent import Agent, AgentStats, Status
from agent_sdk.auction import AgentBid, BidResponse, TaskResult, TaskRFP
from agent_sdk.bidder import Bidder
from agent_sdk.capability import CapabilitySpec, RequestContext, capability
from agent_sdk.errors import (
    AgentIdTakenError,
    AgentSDKError,
    CapabilityError,
    CapabilityNotFoundError,
    DialogueEndedError,
    DialogueError,
    IllegalMoveError,
    InputRequiredError,
    InvalidInputError,
    LobbyError,
    LobbyUnreachableError,
    MessageRefusedError,
    MoveTimeoutError,
    NoProviderError,
    NotConnectedError,
    PayloadError,
    RateLimitedError,
    RegistrationError,
    RemoteError,
    RemoteTimeoutError,
    ReplacedError,
    RequestCancelled,
    RequestError,
    RequestRefusedError,
    RequestTimeoutError,
    TokenRefusedError,
    UnauthorizedError,
    UnknownReceiverError,
)
from agent_sdk.identity import EnvTokenStore, FileTokenStore, MemoryTokenStore, TokenStore
from agent_sdk.market import Order
from agent_sdk.negotiation import DialogueHandle, Move, Round, RoundBid, Transaction
from agent_sdk.policy import Policy, RateLimit
from agent_sdk.presence import PresenceChange, PresenceEvent, Watch
from agent_sdk.turns import Conversation
from protocol.models import Message, MessageType
from protocol.payloads import Capability, ServiceRecord

__all__ = [
    "Agent",
    "AgentBid",
    "AgentIdTakenError",
    "AgentSDKError",
    "AgentStats",
    "BidResponse",
    "Bidder",
    "Capability",
    "CapabilityError",
    "CapabilityNotFoundError",
    "CapabilitySpec",
    "Conversation",
    "DialogueEndedError",
    "DialogueError",
    "DialogueHandle",
    "EnvTokenStore",
    "FileTokenStore",
    "IllegalMoveError",
    "InputRequiredError",
    "InvalidInputError",
    "LobbyError",
    "LobbyUnreachableError",
    "MemoryTokenStore",
    "Message",
    "MessageRefusedError",
    "MessageType",
    "Move",
    "MoveTimeoutError",
    "NoProviderError",
    "NotConnectedError",
    "Order",
    "PayloadError",
    "Policy",
    "PresenceChange",
    "PresenceEvent",
    "RateLimit",
    "RateLimitedError",
    "RegistrationError",
    "RemoteError",
    "RemoteTimeoutError",
    "ReplacedError",
    "RequestCancelled",
    "RequestContext",
    "RequestError",
    "RequestRefusedError",
    "RequestTimeoutError",
    "Round",
    "RoundBid",
    "ServiceRecord",
    "Status",
    "TaskRFP",
    "TaskResult",
    "TokenRefusedError",
    "TokenStore",
    "Transaction",
    "UnauthorizedError",
    "UnknownReceiverError",
    "Watch",
    "capability",
]
