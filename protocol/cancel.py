"""The payload of CANCEL (PROTOCOL.md §5.2): a requester's, to the lobby, and the lobby's, to a
provider."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from protocol.limits import MAX_REASON_LENGTH
from protocol.models import AgentIdRef


class _Payload(BaseModel):
    # As `protocol.payloads._Payload`: JSON types exactly as the schema states them.
    model_config = ConfigDict(extra="ignore", frozen=True, strict=True)


class CancelPayload(_Payload):
    """From a requester: stop waiting for its open REQUESTs in the conversation. From the
    lobby, to a provider: stop working on the REQUEST `in_reply_to` names."""

    reason: str | None = Field(
        default=None,
        max_length=MAX_REASON_LENGTH,
        description="Why; to the provider: 'cancelled', 'deadline' or the requester's reason.",
    )
    requester_id: AgentIdRef | None = Field(
        default=None, description="Set by the lobby, on the CANCEL a provider receives."
    )
