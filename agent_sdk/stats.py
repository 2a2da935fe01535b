"""What an agent reports about itself: its connection `Status` and its `AgentStats` counters."""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Status(enum.StrEnum):
    """Where the agent is in its lifecycle (`Agent.status`)."""

    IDLE = "idle"
    CONNECTING = "connecting"
    CONNECTED = "connected"
    RECONNECTING = "reconnecting"
    STOPPED = "stopped"


@dataclass(slots=True)
class AgentStats:
    """Counters since the agent object was made (`Agent.stats`); never reset."""

    connects: int = 0
    reconnects: int = 0
    resumes: int = 0
    messages_received: int = 0
    messages_sent: int = 0
    duplicates_dropped: int = 0
    handler_errors: int = 0
    overflow_dropped: int = 0
    resent: int = 0
