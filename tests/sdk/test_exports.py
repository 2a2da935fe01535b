"""The exported names of `agent_sdk` (its `__all__`): exactly the documented ones, all present,
and every exception under the one root."""

from __future__ import annotations

import agent_sdk


def test_public_api_is_exactly_the_documented_names() -> None:
    assert set(agent_sdk.__all__) == {
        "TokenStore",
        "TokenRefusedError",
        "ReplacedError",
        "MemoryTokenStore",
        "FileTokenStore",
        "EnvTokenStore",
        "AgentIdTakenError",
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
        "Conversation",
        "DialogueHandle",
        "Round",
        "RoundBid",
        "InvalidInputError",
        "LobbyError",
        "Message",
        "MessageType",
        "Move",
        "LobbyUnreachableError",
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
        "Watch",
        "capability",
        "DialogueEndedError",
        "DialogueError",
        "IllegalMoveError",
        "InputRequiredError",
        "MessageRefusedError",
        "MoveTimeoutError",
        "NoProviderError",
        "PayloadError",
        "RateLimitedError",
        "RemoteTimeoutError",
        "RequestCancelled",
        "Transaction",
        "Policy",
        "PresenceChange",
        "PresenceEvent",
        "RateLimit",
    }
    for name in agent_sdk.__all__:
        assert hasattr(agent_sdk, name), name
    for name in agent_sdk.__all__:
        value = getattr(agent_sdk, name)
        if isinstance(value, type) and issubclass(value, Exception):
            assert issubclass(value, agent_sdk.AgentSDKError), name
