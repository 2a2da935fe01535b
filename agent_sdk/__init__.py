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
from protocol.models import Capability, Message, MessageType, ServiceRecord

__all__ = [
    "Agent",
    "AgentSDKError",
    "AgentStats",
    "Capability",
    "CapabilityError",
    "CapabilityNotFoundError",
    "CapabilitySpec",
    "InvalidInputError",
    "LobbyError",
    "Message",
    "MessageType",
    "NotConnectedError",
    "RegistrationError",
    "RemoteError",
    "RequestContext",
    "RequestError",
    "RequestRefusedError",
    "RequestTimeoutError",
    "ServiceRecord",
    "Status",
    "UnauthorizedError",
    "UnknownReceiverError",
    "capability",
]
