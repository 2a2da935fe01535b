"""The Agent Lobby wire protocol: message types, payload models, codec and JSON Schemas.

Pure: no asyncio, no sockets. Shared by the lobby, the SDK and any third-party implementation.
"""

from protocol.codec import decode, encode, to_dict
from protocol.errors import DecodeError, ProtocolError
from protocol.limits import MAX_AGENT_ID_LENGTH, MAX_ID_LENGTH, MAX_NAME_LENGTH, clip
from protocol.models import (
    AGENT_ID_PATTERN,
    LOBBY_ID,
    CloseCode,
    ErrorCode,
    Message,
    MessageType,
    RegisterStatus,
    ResponseStatus,
    close_code_name,
)
from protocol.payloads import (
    PAYLOAD_MODELS,
    Capability,
    DiscoverServicesPayload,
    ErrorPayload,
    RegisterAckPayload,
    RegisterPayload,
    RequestPayload,
    ResponsePayload,
    ServiceRecord,
    ServicesAvailablePayload,
    UnregisterPayload,
    UpdateCapabilitiesPayload,
)

__all__ = [
    "AGENT_ID_PATTERN",
    "LOBBY_ID",
    "MAX_AGENT_ID_LENGTH",
    "MAX_ID_LENGTH",
    "MAX_NAME_LENGTH",
    "PAYLOAD_MODELS",
    "Capability",
    "CloseCode",
    "DecodeError",
    "DiscoverServicesPayload",
    "ErrorCode",
    "ErrorPayload",
    "Message",
    "MessageType",
    "ProtocolError",
    "RegisterAckPayload",
    "RegisterPayload",
    "RegisterStatus",
    "RequestPayload",
    "ResponsePayload",
    "ResponseStatus",
    "ServiceRecord",
    "ServicesAvailablePayload",
    "UnregisterPayload",
    "UpdateCapabilitiesPayload",
    "clip",
    "close_code_name",
    "decode",
    "encode",
    "to_dict",
]
