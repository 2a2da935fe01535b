"""The payload of INPUT (PROTOCOL.md §5.3): the requester's answer to a RESPONSE's
`input_required`. Free form, as the question it answers."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class InputPayload(BaseModel):
    """INPUT: the requester's answer to an `input_required`, any object."""

    model_config = ConfigDict(extra="allow", frozen=True)
