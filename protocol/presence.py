"""Presence on the wire: WATCH, UNWATCH and PRESENCE (PROTOCOL.md §4.1).

An agent WATCHes a capability name or a list of agent ids; the lobby answers with the matching
agents as they are now (`snapshot` frames, then one `snapshot_end`) and then one PRESENCE per
change (`online`, `offline`, `capabilities_changed`, `removed`) until UNWATCH or the end of the
connection. PRESENCE frames are state, not messages: never stored, never replayed, no `seq`.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Final, Self

from pydantic import BaseModel, ConfigDict, Field, model_validator

from protocol.limits import MAX_NAME_LENGTH
from protocol.models import AgentIdRef

MAX_WATCHES: Final = 16
"""Watches one connection may hold at once; one more is refused with `limit_exceeded`."""
MAX_WATCHED_AGENTS: Final = 1000
"""Agent ids one WATCH may name; more is refused with `malformed` (a bound of the payload)."""


class _Payload(BaseModel):
    # As `protocol.payloads._Payload`: JSON types exactly as the schema states them.
    model_config = ConfigDict(extra="ignore", frozen=True, strict=True)


class PresenceEvent(StrEnum):
    """The `event` of a PRESENCE."""

    SNAPSHOT = "snapshot"
    """The agent as it is now: one per matching registered agent, in answer to WATCH."""
    SNAPSHOT_END = "snapshot_end"
    """The last frame of the answer to WATCH: `count` snapshot frames came before it."""
    ONLINE = "online"
    """The agent registered, or resumed while it had no connection."""
    OFFLINE = "offline"
    """Its connection closed (not replaced by a newer one of its own); it stays registered."""
    CAPABILITIES_CHANGED = "capabilities_changed"
    """It declared different capabilities (UPDATE_CAPABILITIES, or a resume that carries
    them) while online."""
    REMOVED = "removed"
    """It is gone (UNREGISTER, `lobby remove`)."""


class WatchPayload(_Payload):
    """WATCH: exactly one of `capability_name` (the agents offering it) and `agent_ids`."""

    # "Exactly one" as a `not` (both, or neither): generators leave `not` alone, where a
    # `oneOf` would turn the payload into a union a Go model cannot read back.
    model_config = ConfigDict(
        json_schema_extra={
            "not": {
                "anyOf": [
                    {"required": ["capability_name", "agent_ids"]},
                    {
                        "allOf": [
                            {"not": {"required": ["capability_name"]}},
                            {"not": {"required": ["agent_ids"]}},
                        ]
                    },
                ]
            }
        }
    )

    capability_name: Annotated[str, Field(min_length=1, max_length=MAX_NAME_LENGTH)] | None = Field(
        default=None, description="Watch the agents offering this capability."
    )
    agent_ids: list[AgentIdRef] | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_WATCHED_AGENTS,
        description=f"Watch these agents (at most {MAX_WATCHED_AGENTS}).",
    )

    @model_validator(mode="after")
    def _exactly_one(self) -> Self:
        if (self.capability_name is None) == (self.agent_ids is None):
            raise ValueError("WATCH takes exactly one of 'capability_name' and 'agent_ids'")
        return self


class UnwatchPayload(_Payload):
    """UNWATCH: ends the watch its `conversation_id` names."""


class PresencePayload(_Payload):
    """PRESENCE (lobby to watcher). `snapshot_end` carries only `event` and `count`; every
    other event carries `agent_id`, `online` and `capabilities`."""

    event: PresenceEvent
    agent_id: str | None = None
    online: bool | None = Field(default=None, description="Whether it has a connection now.")
    capabilities: list[str] | None = Field(
        default=None,
        description="The names of the capabilities it offers that the watcher may discover "
        "(as DISCOVER_SERVICES would list them), sorted; [] once removed.",
    )
    count: int | None = Field(
        default=None, ge=0, description="snapshot_end only: the snapshot frames sent."
    )


__all__ = [
    "MAX_WATCHED_AGENTS",
    "MAX_WATCHES",
    "PresenceEvent",
    "PresencePayload",
    "UnwatchPayload",
    "WatchPayload",
]
