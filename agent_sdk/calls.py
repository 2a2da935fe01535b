"""Outstanding calls: what the agent waits for, keyed by conversation id.

A `Call` is one `request()`: a future for the final RESPONSE and, for `request_stream()`, a
bounded queue of `in_progress` updates. Calls live in the agent, not in a connection, so they
survive a reconnect: a RESPONSE that arrives on the next connection still completes them.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from typing import Any

from agent_sdk.errors import AgentSDKError, refused_error, remote_error
from protocol.models import ResponseStatus

PROGRESS_QUEUE_SIZE = 256
"""In-progress updates kept for a slow `request_stream()` consumer; older ones are dropped."""


class Call:
    """One REQUEST waiting for its final RESPONSE."""

    __slots__ = ("capability", "dropped_updates", "receiver_id", "result", "updates")

    def __init__(self, receiver_id: str, capability: str, *, stream: bool) -> None:
        self.receiver_id = receiver_id
        self.capability = capability
        self.result: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self.updates: asyncio.Queue[dict[str, Any]] | None = (
            asyncio.Queue(PROGRESS_QUEUE_SIZE) if stream else None
        )
        self.dropped_updates = 0

    def on_response(self, payload: dict[str, Any]) -> bool:
        """Feed a RESPONSE payload; True when it was the final one."""
        status = payload.get("status")
        if status == ResponseStatus.IN_PROGRESS:
            if self.updates is not None:
                if self.updates.full():
                    self.updates.get_nowait()
                    self.dropped_updates += 1
                self.updates.put_nowait(payload)
            return False
        if not self.result.done():
            if status == ResponseStatus.SUCCESS:
                self.result.set_result(payload)
            else:
                self.result.set_exception(remote_error(payload))
        return True

    def on_error(self, code: str, message: str) -> None:
        """The lobby refused the REQUEST (an ERROR naming its conversation)."""
        if not self.result.done():
            self.result.set_exception(refused_error(code, message))

    def fail(self, exc: AgentSDKError) -> None:
        if not self.result.done():
            self.result.set_exception(exc)
            # Nobody may be awaiting any more (e.g. on stop): mark it retrieved.
            self.result.exception()


class SeenMessages:
    """The (sender, message_id) pairs seen lately, to drop a redelivered message. Bounded:
    the oldest are forgotten past `size`."""

    def __init__(self, size: int) -> None:
        self._size = size
        self._seen: OrderedDict[tuple[str, str], None] = OrderedDict()

    def check_and_add(self, sender_id: str, message_id: str) -> bool:
        """True if this message was seen before (and so must be dropped)."""
        key = (sender_id, message_id)
        if key in self._seen:
            return True
        self._seen[key] = None
        if len(self._seen) > self._size:
            self._seen.popitem(last=False)
        return False
