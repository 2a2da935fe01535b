"""What a cluster node answers while it steps down to rejoin (`LobbyServer.fence`): the close
reason of its agents' connections (1012) and the ERROR `node_unavailable` to a REGISTER."""

from __future__ import annotations

from typing import Final

import orjson

from lobby.core.refusal import error_payload
from protocol.codec import encode
from protocol.models import LOBBY_ID, ErrorCode, Message, MessageType

REJOINING: Final = "this lobby node is rejoining the cluster: connect to another node"


def refusal(data: bytes) -> bytes:
    """The ERROR frame answering `data` (a frame of a connection that has not registered)."""
    try:
        sent = orjson.loads(data)
        message_type = sent.get("message_type") if isinstance(sent, dict) else None
    except orjson.JSONDecodeError:
        message_type = None
    original = message_type if message_type in MessageType.__members__ else None
    payload = error_payload(ErrorCode.NODE_UNAVAILABLE, REJOINING, original, None)
    return encode(Message(LOBBY_ID, "", MessageType.ERROR, payload))
