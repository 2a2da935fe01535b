"""The agent's side of the delivery promise, as plain bookkeeping (no I/O).

Inbound: every message the lobby delivers carries a per-receiver `seq`. A message is done when
its callback finished (or it needed none); `Inbound.watermark` is the highest `seq` with
everything up to it done, which the agent sends back as `ACK {"up_to": ...}`, batched.

Outbound: every message the agent sends to another agent gets a `message_id` and is kept in
`Outbound` until the lobby confirms it (`ACCEPTED {"message_id": ...}` covers that message and
all sent before it). After a reconnect, whatever is still unconfirmed is sent again with the
same `message_id`; the lobby recognises a resend and delivers it once.
"""

from __future__ import annotations

from collections import OrderedDict

from protocol.models import Message


class Inbound:
    """Which delivered messages are done, to acknowledge them cumulatively: owns the highest
    `seq` seen, the `seq`s still handled, the last `up_to` acknowledged and the epoch (one per
    registration)."""

    def __init__(self) -> None:
        self.epoch = 0
        self.highest = 0
        self.acked = 0
        self._in_progress: set[int] = set()
        self._abandoned: set[int] = set()
        """`seq`s whose handler was cancelled (the agent stopped): never acknowledged until
        the lobby delivers them again."""

    def reset(self) -> None:
        """The lobby no longer knows this agent (fresh registration): numbering restarts.
        Completions from before carry the old epoch and are ignored."""
        self.epoch += 1
        self.highest = self.acked = 0
        self._in_progress.clear()
        self._abandoned.clear()

    def received(self, seq: int, *, done: bool) -> None:
        if seq > self.highest:
            self.highest = seq
        if not done:
            self._in_progress.add(seq)
        if self._abandoned:
            self._abandoned.discard(seq)

    def is_in_progress(self, seq: int) -> bool:
        return seq in self._in_progress

    def done(self, seq: int, epoch: int) -> None:
        if epoch == self.epoch:
            self._in_progress.discard(seq)

    def abandon(self, seq: int, epoch: int) -> None:
        """The handler of `seq` was cancelled, not finished: hold the watermark below it until
        the lobby delivers it again (it does, to a resumed agent, as it was never
        acknowledged)."""
        if epoch == self.epoch:
            self._in_progress.discard(seq)
            self._abandoned.add(seq)

    @property
    def watermark(self) -> int:
        mark = min(self._in_progress) - 1 if self._in_progress else self.highest
        if self._abandoned:
            mark = min(mark, min(self._abandoned) - 1)
        return mark

    def ack_due(self) -> int | None:
        """The `up_to` to acknowledge now, if it moved."""
        mark = self.watermark
        return mark if mark > self.acked else None


class Outbound:
    """Owns the messages sent to other agents and not yet confirmed by the lobby, oldest
    first, up to `limit`."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._pending: OrderedDict[str, Message] = OrderedDict()

    def __len__(self) -> int:
        return len(self._pending)

    @property
    def full(self) -> bool:
        return len(self._pending) >= self.limit

    def add(self, message: Message) -> None:
        assert message.message_id is not None
        self._pending[message.message_id] = message

    def confirmed(self, message_id: str) -> int:
        """The lobby accepted `message_id` and everything before it; return how many left."""
        if message_id not in self._pending:
            return 0
        released = 0
        while self._pending:
            key, _ = self._pending.popitem(last=False)
            released += 1
            if key == message_id:
                break
        return released

    def refused(self, message_id: str) -> None:
        """The lobby refused this message (ERROR): it is settled, never to be resent."""
        self._pending.pop(message_id, None)

    def unconfirmed(self) -> list[Message]:
        return list(self._pending.values())
