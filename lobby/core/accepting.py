"""What a sender is told is ACCEPTED while some of its messages wait on other nodes. Sans-I/O.

ACCEPTED(m) says m, and every message its sender sent before it on this connection, is stored
(or was refused). On one node the group commit keeps that true by itself: a commit stores
everything journaled before it. On a cluster a message to an agent on another node is stored by
that node (its home), on its own schedule, so a later message stored here, or on a third node,
may be durable before it. The sender's node therefore decides every ACCEPTED its senders get:

- while none of a sender's forwarded messages is outstanding, nothing is kept: a commit here
  confirms the sender's last message in it, as on one node;
- from its first forwarded message on, its session keeps `Unsettled`: the messages it sent
  since, in order, each stored here (settled by the next commit here) or on another node
  (settled when that node confirms its link's batch holding it, `lobby.done`: committed or
  refused there; a failover's or a move's new home confirms it the same way);
- the sender is told ACCEPTED only for the last message of the longest settled prefix, when it
  advances; once nothing is left the session drops the record and goes back to the plain path.

A message refused here never enters the record (its ERROR went out at once). The record belongs
to the session: a replaced connection's is dropped with it, and the SDK resends on its new
connection whatever it was not told (the homes' dedupe absorbs what they had).
"""

from __future__ import annotations

from collections import deque


class Entry:
    """One message of a sender's, in the order it was sent."""

    __slots__ = ("message_id", "n", "settled")

    def __init__(self, message_id: str, n: int) -> None:
        self.message_id = message_id
        self.n = n
        """Stored here: the how-manieth message stored here in this record (0: elsewhere)."""
        self.settled = False


class Unsettled:
    """A sender session's messages since its first forwarded one still outstanding.

    Call `here` when one is journaled here (and confirmed: `Delivery.confirm`), `away` when one
    is forwarded, `take` when a batch holding its confirmations is handed to the store,
    `committed` once that batch is durable, `stored` when a home confirms one it was forwarded.
    `committed` and `stored` return the message_id to tell ACCEPTED, if the prefix advanced."""

    __slots__ = ("away_ids", "entries", "here_count", "here_queue", "moved", "taken")

    def __init__(self) -> None:
        self.entries: deque[Entry] = deque()
        """Every message since the record began, oldest first, until a settled prefix goes."""
        self.here_queue: deque[Entry] = deque()
        """The entries stored here and not yet committed, oldest first."""
        self.away_ids: dict[str, Entry] = {}
        """message_id -> entry of each forwarded message not yet confirmed by its home."""
        self.here_count = 0
        self.taken: int | None = None
        """`here_count` when the batch being written was taken (None: no such batch holds one
        of this record's messages; a batch taken before the record began is the plain path's)."""
        self.moved: set[str] = set()
        """Forwarded messages being routed here now (their receiver moved to this node): their
        entry became a `here` one, so their confirmation adds none."""

    def here(self, message_id: str) -> None:
        if self.moved and message_id in self.moved:
            self.moved.discard(message_id)
            return
        self.here_count += 1
        entry = Entry(message_id, self.here_count)
        self.entries.append(entry)
        self.here_queue.append(entry)

    def away(self, message_id: str) -> None:
        if message_id in self.away_ids:
            return  # sent again before its home confirmed it: the one entry stands for both
        entry = Entry(message_id, 0)
        self.entries.append(entry)
        self.away_ids[message_id] = entry

    def moved_here(self, message_id: str) -> None:
        """A forwarded message is routed here after all (its receiver's home is this node now):
        it is settled by a commit here, and its confirmation there is not counted twice."""
        entry = self.away_ids.pop(message_id, None)
        if entry is None:
            return
        self.here_count += 1
        entry.n = self.here_count
        self.here_queue.append(entry)
        self.moved.add(message_id)

    def routed_here(self, message_id: str) -> str | None:
        """Call after routing here a message `moved_here`: unless a confirmation took it (it
        was refused: the ERROR went out), it is settled now."""
        if message_id not in self.moved:
            return None
        self.moved.discard(message_id)
        for entry in self.here_queue:
            if entry.message_id == message_id:
                entry.settled = True
        return self._advance()

    def waits_for(self, message_id: str) -> bool:
        """Whether forwarded message `message_id` is not yet confirmed by its home."""
        return message_id in self.away_ids

    def take(self) -> None:
        self.taken = self.here_count

    def committed(self) -> str | None:
        """The batch taken last (`take`) is durable."""
        upto, self.taken = self.taken, None
        queue = self.here_queue
        while queue and queue[0].n <= (upto or 0):
            queue.popleft().settled = True
        return self._advance()

    def stored(self, message_id: str) -> str | None:
        """Another node confirmed (stored or refused) forwarded message `message_id`."""
        entry = self.away_ids.pop(message_id, None)
        if entry is None:
            return None
        entry.settled = True
        return self._advance()

    @property
    def done(self) -> bool:
        """Nothing outstanding and no batch of its being written: back to the plain path."""
        return not self.entries and self.taken is None

    def _advance(self) -> str | None:
        entries = self.entries
        last = None
        while entries and entries[0].settled:
            last = entries.popleft().message_id
        return last
