"""The forward link between two lobby nodes, each end's bookkeeping as plain state: no NATS,
no clock read here (the relay passes `now`), tested synchronously.

The forwarding node numbers the batches it forwards to one home 1, 2, 3, ... for as long as
its process lives; its `incarnation` (a random id per process) tells a restarted process's
numbering from the last one's. Every message on `lobby.fwd.<home>` covers a contiguous range
of batch numbers, `first` to `last`: a new batch covers its own number; a resend covers every
number from where it starts to the newest published, numbers with nothing left to send
included (confirmed meanwhile, or moved to another home with their receiver). It also carries
`low`, the oldest batch the forwarding node still keeps: the home confirmed everything below.

The home keeps, per forwarding node, the next batch number it expects (`Inbound`). A message
whose range starts past it shows a gap: core NATS dropped something (a reconnect, an outage,
a slow consumer). It is not routed, and the home asks for everything from the number it
expects (`lobby.gap`). Any other message is routed (what was routed before is absorbed by the
(sender, message_id) dedupe) and, once committed, confirmed: "up to `last`", true because
nothing before it is missing. A home that does not know the forwarding node's incarnation
(either end restarted) starts from `low`. So a confirmation never covers a message the home
did not store, and one lost in transit is resent before anything after it is routed.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from typing import Final, NamedTuple

BATCH_BYTES: Final = 512 * 1024
"""Bytes of frames one batch (and one resend message) holds at most, below NATS's default
max_payload of 1 MiB: a larger pass is numbered as several batches."""
ASK_EVERY: Final = 0.5
"""Seconds between a home's requests for the same gap (each message past a gap shows it)."""


class Pending(NamedTuple):
    """A forwarded message its home has not confirmed."""

    batch: int
    receiver: str
    sender: str
    message_id: str
    frame: bytes
    decided: bool


class Chunk(NamedTuple):
    """One message of a resend: batch numbers `first` to `last` and what is kept of them."""

    first: int
    last: int
    entries: list[Pending]


class Outbound:
    """The forwarding node's end of its link to one home: what it numbered, published, and
    keeps until the home confirms it."""

    def __init__(self) -> None:
        self.last = 0
        """The newest batch number given out."""
        self.published = 0
        """The newest batch number published (a decided batch waits for this node's commit)."""
        self.kept: deque[Pending] = deque()
        """What the home has not confirmed, in batch order."""
        self.left_out: set[tuple[str, str]] = set()
        """(sender, message_id) the home left out (their receiver is not its agent): kept past
        later confirmations until the receiver's new home is known (`moved`)."""
        self.sent: deque[tuple[int, float]] = deque()
        """(batch, when): batches up to `batch` (after the previous entry's) went out at `when`."""

    def low(self) -> int:
        """The oldest batch still kept (the home confirmed everything below)."""
        return self.kept[0].batch if self.kept else self.last + 1

    def number(self) -> int:
        self.last += 1
        return self.last

    def keep(self, entries: Iterable[Pending], limit: int) -> list[Pending]:
        """Keep what a new batch carries; drop the oldest past `limit` (returned)."""
        kept = self.kept
        kept.extend(entries)
        excess = len(kept) - limit
        return [kept.popleft() for _ in range(max(excess, 0))]

    def went_out(self, batch: int, now: float) -> None:
        """Batches up to `batch` were published at `now`."""
        self.published = max(self.published, batch)
        self.sent.append((batch, now))

    def confirmed(
        self, first: int, last: int, left_out: Iterable[tuple[str, str]]
    ) -> list[tuple[str, str]]:
        """The home committed (or refused) what it was sent up to batch `last`, leaving out
        `left_out` of the batches from `first` on: those stay kept, the rest of that range is
        no longer left out (routed there after all). Returns the (sender, message_id) no
        longer kept: settled there."""
        kept = self.kept
        if not kept or kept[0].batch > last:
            return []
        verdict = set(left_out)
        held = self.left_out
        stay: list[Pending] = []
        settled: list[tuple[str, str]] = []
        while kept and kept[0].batch <= last:
            entry = kept.popleft()
            key = (entry.sender, entry.message_id)
            if entry.batch >= first:
                if key in verdict:
                    held.add(key)
                    stay.append(entry)
                    continue
                held.discard(key)
            elif key in held:
                stay.append(entry)
                continue
            settled.append(key)
        kept.extendleft(reversed(stay))
        return settled

    def resend(self, first: int) -> list[Chunk]:
        """What to publish again from batch `first` to the newest published: whole batches,
        at most `BATCH_BYTES` of frames per message, the first message's range starting at
        `first` and each next one where the last ended."""
        if first > self.published:
            return []
        chunks: list[Chunk] = []
        entries: list[Pending] = []
        start, size, batch = first, 0, 0
        for entry in self.kept:
            if entry.batch < first:
                continue
            if entry.batch > self.published:
                break
            if entry.batch != batch and entries and size + len(entry.frame) > BATCH_BYTES:
                chunks.append(Chunk(start, entry.batch - 1, entries))
                start, entries, size = entry.batch, [], 0
            batch = entry.batch
            entries.append(entry)
            size += len(entry.frame)
        chunks.append(Chunk(start, self.published, entries))
        return chunks

    def overdue(self, now: float, after: float) -> int | None:
        """The batch to resend from when the oldest kept one went out `after` seconds ago or
        more without a confirmation; else None."""
        sent, kept = self.sent, self.kept
        if not kept:
            sent.clear()
            return None
        oldest = kept[0].batch
        while sent and sent[0][0] < oldest:
            sent.popleft()  # batches confirmed whole
        if not sent or oldest > self.published or now - sent[0][1] < after:
            return None
        return oldest

    def resent(self, now: float) -> None:
        """Everything published went out again at `now`."""
        self.sent.clear()
        self.sent.append((self.published, now))

    def moved(self, receiver: str) -> list[Pending]:
        """Stop keeping what is for `receiver` (its home changed): those entries, in order."""
        moved = [e for e in self.kept if e.receiver == receiver]
        if moved:
            self.kept = deque(e for e in self.kept if e.receiver != receiver)
            self.left_out.difference_update((e.sender, e.message_id) for e in moved)
        return moved


class Inbound:
    """The home's end of one forwarding node's link: the next batch number it expects."""

    def __init__(self) -> None:
        self.incarnation = ""
        self.expect = 0
        self._asked: tuple[int, float] = (0, float("-inf"))

    def take(self, incarnation: str, first: int, last: int, low: int) -> bool:
        """Whether a message covering batches `first`..`last` is to be routed: False when it
        starts past a gap (then `ask` whether to request the resend)."""
        if incarnation != self.incarnation:
            self.incarnation, self.expect = incarnation, low
        elif low > self.expect:
            self.expect = low  # what lies below was confirmed, or moved away
        if first > self.expect:
            return False
        self.expect = max(self.expect, last + 1)
        return True

    def ask(self, now: float) -> bool:
        """Whether to request a resend from `expect` now (once per `ASK_EVERY` per number)."""
        expect, at = self._asked
        if expect == self.expect and now - at < ASK_EVERY:
            return False
        self._asked = (self.expect, now)
        return True
