"""Messages between lobby nodes, over core NATS.

The sender's node authenticates a message and checks it against the shared registry (the
capability, its authorization, the conversation) as for a local receiver; when the receiver's
connection is on another node (its home) the core queues the message (`Delivery.forwards`)
instead of storing it. Once per pass of the loop this node publishes what it queued, one NATS
message per destination node, on `lobby.fwd.<home>`.

The home routes each forwarded message as its own (`Router.relayed`): it checks it again,
dedupes it by (sender, message_id), stamps its `seq`, stores and delivers it. The sender is
stood for there by a relay session whose link is `NodeLink`: what the home answers it at once
(an ERROR) is published back on `lobby.ret.<sender's node>` (one NATS message per node per
pass) and written to the sender's connection there. ACCEPTED is the sender's node's to decide
(`lobby.core.accepting`): the home's `lobby.done` (below) says which forwarded messages it
committed, and the sender is told ACCEPTED for the end of its longest prefix of messages
stored here or on their homes. So a cross-node message is ACCEPTED only once its home has
committed it, a later one stored sooner never covers it, and a resend after a lost answer is
absorbed by the home's dedupe.

Resending (failover, a receiver that moved, a message core NATS dropped): the sender's node
keeps every message it forwarded, per destination node and in order, until that node says it
committed or refused it. The link is numbered (`lobby.cluster.links`): each batch forwarded to
a node has the next number, the home routes a node's batches only without a gap, asks for a
gap to be resent (`lobby.gap.<sender's node>`), and after each commit publishes
`lobby.done.<sender's node>`: "everything up to batch N, except these (sender, message_id)"
(the ones whose receiver is not its agent any more: kept past later confirmations until their
receiver's new home is known). When a receiver's home changes (a resume on another node, a
failover's adoption), what is kept for it is sent again, in order, to its new home, or routed
here when that is this node; the new home's (sender, message_id) dedupe absorbs repeats. A
forwarded message is never forwarded a second time (no loops between nodes whose views differ
for a moment): it stays with its sender's node until that node learns where its receiver is.
At most `RESEND_LIMIT` messages are kept per destination node; past that the oldest is dropped
from the resend buffer (logged CLUSTER_RESEND_DROPPED) and only its sender's own resend after a
reconnect can repair its loss: a sender still connected here, never told it ACCEPTED, is closed
with 1013 to resend it (`Router.lost_away`). A node that leaves a batch unconfirmed for
`RESEND_AFTER` seconds (the last message before an outage, or its confirmation, lost) is sent
everything kept for it again; its dedupe absorbs what it had.

A message from a sender the home has not learned yet (it registered on another node a moment
ago) stops that node's link there: the home reads the sender's entry from the shared registry
(`learn`), then routes the rest, and what that node forwarded meanwhile, in order.

Dialogue moves, order proposals and payments are decided by the one node their dialogue or
proposal lives on (`lobby.core.commerce.negotiation`): a move made elsewhere is forwarded there like
a REQUEST, and what that node decided for a party on another node (the move, the lobby's notices)
is forwarded marked decided, once the decision is committed on the deciding node; the home
stores and delivers it without checking it again (`Router.decided`).

Wire form: `lobby.fwd` and `lobby.ret` are lines of UTF-8, the first the sending node's id (on
`lobby.fwd` followed by its incarnation and the batch numbers first, last and low, space
separated: `lobby.cluster.links`), then pairs of lines (an agent id, a
frame; on `lobby.fwd` the agent id is preceded by `=` when the frame was decided). Frames are
single-line JSON (orjson writes no newline), so nothing is decoded or encoded again on the way.
`lobby.done`: a line "<node> <incarnation> <first> <last>", then a JSON array of [sender,
message_id] pairs left out. `lobby.gap`: "<node> <incarnation> <batch to resend from>".
`lobby.ping.<node>` is answered while the node is up (a resume
elsewhere asks it first: `lobby.core.cluster.shared`). Agents handed over between live nodes:
`lobby.cluster.handovers`.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Awaitable, Callable, Coroutine, Iterable
from typing import Any, Final

import nats.errors
import nats.js.errors
import orjson
import structlog
from nats.aio.client import Client
from nats.aio.msg import Msg

from lobby.cluster.links import BATCH_BYTES, Chunk, Inbound, Outbound, Pending
from lobby.cluster.relayed import NodeLink, SilentLink
from lobby.core.router import Router
from lobby.core.session import Action, Send, Session
from protocol.models import LOBBY_ID

log = structlog.get_logger("lobby.cluster")

RESEND_LIMIT: Final = 100_000
"""Forwarded messages kept per destination node until it confirms them."""
RESEND_AFTER: Final = 5.0
"""Seconds without a confirmation after which what was forwarded to a node is sent to it
again (core NATS may drop a message: a slow consumer, a reconnect)."""
PROBE_TIMEOUT: Final = 1.0
"""Seconds a node waits for another's answer to `lobby.ping` before counting it down."""
_DECIDED: Final = b"="
"""Marks a forwarded message's sender line when the forwarding node decided it (`=` is in no
agent id): the home stores and delivers it without checking it again (`Router.decided`)."""


class Relay:
    """Forwards this node's queued messages and routes the ones forwarded to it. `start`
    subscribes; `kick` after each pass; `stop` waits for the publishes in flight. `durable`
    runs a callback once what was journaled so far is committed (the committer's marks)."""

    def __init__(
        self,
        node_id: str,
        router: Router,
        execute: Callable[[Iterable[Action]], None],
        durable: Callable[[Callable[[], None]], None],
    ) -> None:
        self.node_id = node_id
        self.router = router
        self._execute = execute
        self._durable = durable
        self._nc: Client | None = None
        self._sessions: dict[tuple[str, str], Session] = {}
        """(node, agent id) -> the relay session standing for that agent of that node."""
        self._tasks: set[asyncio.Task[None]] = set()
        self._header = node_id.encode()
        self.returns: dict[str, list[bytes]] = {}
        """Node -> (agent id, frame) lines answering its agents, published by `kick`."""
        self.incarnation = uuid.uuid4().hex[:12]
        """This process's id on the links it forwards on: a restarted node numbers anew."""
        self.links: dict[str, Outbound] = {}
        """Destination node -> what was forwarded to it and not yet confirmed."""
        self._inbound: dict[str, Inbound] = {}
        """Forwarding node -> the batch number expected from it next."""
        self._stalled: dict[str, list[bytes]] = {}
        """Forwarding node -> what it forwarded while this node reads the registration of a
        sender it did not know (its link waits, in order, until that is learned)."""
        self.learn: Callable[[str], Awaitable[None]] | None = None
        """Reads an agent's entry from the shared registry into the core (the node's)."""
        self._resending: asyncio.Task[None] | None = None
        self._deferred = 0
        """Passes of forwards waiting for this node's commit (`kick`)."""
        self.resent = 0
        self.dropped = 0

    async def start(self, nc: Client) -> None:
        self._nc = nc
        await nc.subscribe(f"lobby.fwd.{self.node_id}", cb=self._forwarded)
        await nc.subscribe(f"lobby.ret.{self.node_id}", cb=self._returned)
        await nc.subscribe(f"lobby.done.{self.node_id}", cb=self._done)
        await nc.subscribe(f"lobby.gap.{self.node_id}", cb=self._gap)
        await nc.subscribe(f"lobby.ping.{self.node_id}", cb=self._pinged)
        self._resending = asyncio.create_task(self._resend_unanswered())

    async def stop(self) -> None:
        if self._resending is not None:
            self._resending.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._resending
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    def kick(self) -> None:
        """Publish what the core queued for other nodes and the answers to their agents: one
        NATS message per node and subject. Call after the links were flushed."""
        returns = self.returns
        if returns:
            for node_id, lines in returns.items():
                self._publish(f"lobby.ret.{node_id}", b"\n".join([self._header, *lines]))
            returns.clear()  # the same dict: every NodeLink holds it
        delivery = self.router.delivery
        forwards = delivery.forwards
        if not forwards:
            return
        delivery.forwards = []
        by_node: dict[str, list[list[bytes]]] = {}
        sizes: dict[str, int] = {}
        kept: dict[str, list[Pending]] = {}
        decided_any = False
        for home, receiver, sender, message_id, frame, decided in forwards:
            link = self.links.get(home)
            if link is None:
                link = self.links[home] = Outbound()
            batches = by_node.get(home)
            if batches is None or sizes[home] + len(frame) > BATCH_BYTES:
                lines = [b"%d" % link.number()]  # the header's place; see `_batch`
                if batches is None:
                    batches = by_node[home] = []
                    kept[home] = []
                batches.append(lines)
                sizes[home] = 0
            lines = batches[-1]
            sizes[home] += len(frame)
            if decided:
                decided_any = True
                lines.append(_DECIDED + sender.encode())
            else:
                lines.append(sender.encode())
            lines.append(frame)
            kept[home].append(Pending(link.last, receiver, sender, message_id, frame, decided))
        published: list[tuple[str, int, bytes]] = []
        for home, batches in by_node.items():
            link = self.links[home]
            dropped = link.keep(kept[home], RESEND_LIMIT)
            if dropped:
                self.dropped += len(dropped)
                log.warning("CLUSTER_RESEND_DROPPED", node_id=home, messages=len(dropped))
                self._execute(self.router.lost_away((e.sender, e.message_id) for e in dropped))
            for lines in batches:
                batch = int(lines[0])
                lines[0] = self._batch_header(link, batch, batch)
                published.append((home, batch, b"\n".join(lines)))
        if decided_any or self._deferred:
            # What this node decided (a dialogue move, a payment) leaves once the dialogue's or
            # proposal's new state is committed here, so no node delivers a move its decider
            # could lose; what follows it waits in line behind it.
            self._deferred += 1
            self._durable(lambda: self._publish_deferred(published))
        else:
            self._publish_batches(published)

    def _batch_header(self, link: Outbound, first: int, last: int) -> bytes:
        incarnation = self.incarnation.encode()
        return b"%s %s %d %d %d" % (self._header, incarnation, first, last, link.low())

    def _publish_batches(self, published: list[tuple[str, int, bytes]]) -> None:
        now = time.monotonic()
        for home, batch, data in published:
            self.links[home].went_out(batch, now)
            self._publish(f"lobby.fwd.{home}", data)

    def _publish_deferred(self, published: list[tuple[str, int, bytes]]) -> None:
        self._deferred -= 1
        self._publish_batches(published)

    def _resend(self, home: str, first: int) -> None:
        """Publish again what is kept for `home` from batch `first` on (`Outbound.resend`)."""
        link = self.links[home]
        chunks: list[Chunk] = link.resend(first)
        for chunk in chunks:
            lines = [self._batch_header(link, chunk.first, chunk.last)]
            for entry in chunk.entries:
                sender = entry.sender.encode()
                lines.append(_DECIDED + sender if entry.decided else sender)
                lines.append(entry.frame)
            self._publish(f"lobby.fwd.{home}", b"\n".join(lines))
            self.resent += len(chunk.entries)
        if chunks:
            link.resent(time.monotonic())

    def unanswered(self, now: float) -> None:
        """Send again everything kept for a node whose oldest batch kept went out
        `RESEND_AFTER` seconds ago without a confirmation."""
        for home, link in self.links.items():
            first = link.overdue(now, RESEND_AFTER)
            if first is not None:
                log.info("CLUSTER_RESENT_UNANSWERED", node_id=home, messages=len(link.kept))
                self._resend(home, first)

    async def _resend_unanswered(self) -> None:
        while True:
            await asyncio.sleep(1.0)
            now = time.monotonic()
            self.unanswered(now)
            if self.router.delivery.forwards:
                self.kick()

    def rehome(self, agent_id: str, old: str, new: str | None) -> None:
        """`agent_id`'s home moved from node `old` to `new` (None: this node): what was
        forwarded to it and not confirmed goes to the new home, in order, ahead of anything
        sent to it from now on."""
        link = self.links.get(old)
        moved = link.moved(agent_id) if link is not None else []
        delivery = self.router.delivery
        entries = [(e[1], e[2], e[3], e[4], e[5]) for e in moved]
        if delivery.forwards:  # queued this pass for the old home
            queued = [f for f in delivery.forwards if f[0] == old and f[1] == agent_id]
            if queued:
                delivery.forwards = [
                    f for f in delivery.forwards if not (f[0] == old and f[1] == agent_id)
                ]
                entries += [(f[1], f[2], f[3], f[4], f[5]) for f in queued]
        if not entries:
            return
        self.resent += len(entries)
        log.info(
            "CLUSTER_RESENT",
            agent_id=agent_id,
            from_node=old,
            to_node=new or self.node_id,
            messages=len(entries),
        )
        if new is not None:
            delivery.forwards[:0] = [(new, r, s, m, f, d) for r, s, m, f, d in entries]
            return
        router = self.router
        actions: list[Action] = []
        for _, sender_id, message_id, frame, decided in entries:
            sender = router.registry.get(sender_id)
            if sender is None:
                if decided and sender_id == LOBBY_ID:
                    actions += router.decided(None, frame) or []
                continue
            session = sender.session
            if session is None or sender.home is not None:
                session = router.open(remote=SilentLink.remote, link=SilentLink())
                session.agent = sender
            elif session.unsettled is not None:  # settled by a commit here now
                session.unsettled.moved_here(message_id)
            try:
                if decided:
                    actions += router.decided(session, frame) or []
                else:
                    actions += router.relayed(session, frame)
            except Exception:
                log.exception("ROUTER_FAILED", session=session.id)
            if (unsettled := session.unsettled) is not None:  # refused here: settled (ERROR)
                actions += router.state.told_accepted(session, unsettled.routed_here(message_id))
        self._execute(actions)

    async def probe(self, node_id: str) -> bool:
        """Whether node `node_id` answers on `lobby.ping` within `PROBE_TIMEOUT`."""
        if self._nc is None:
            return False
        try:
            await self._nc.request(f"lobby.ping.{node_id}", b"", timeout=PROBE_TIMEOUT)
        except (nats.errors.Error, TimeoutError):
            return False
        return True

    def _publish(self, subject: str, data: bytes) -> None:
        if self._nc is None:
            return
        self._spawn(self._nc.publish(subject, data))

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # -- what other nodes send -----------------------------------------------------------

    async def _forwarded(self, msg: Msg) -> None:
        data = msg.data
        origin = data[: data.find(b" ")].decode()
        stalled = self._stalled.get(origin)
        if stalled is not None:
            stalled.append(data)  # behind a sender being looked up: in order, after it
        else:
            self._route_forwarded(origin, data)

    def _route_forwarded(
        self,
        origin: str,
        data: bytes,
        start: int = 0,
        looked_up: str | None = None,
        left_out: list[tuple[str, str]] | None = None,
    ) -> None:
        """Route what node `origin` forwarded (`data`; resumed from its line `start`, with
        what it `left_out` so far, once `looked_up` was read from the shared registry)."""
        lines = data.split(b"\n")
        header = lines[0].split(b" ")
        first, last = int(header[2]), int(header[3])
        if start == 0:
            inbound = self._inbound.get(origin)
            if inbound is None:
                inbound = self._inbound[origin] = Inbound()
            if not inbound.take(header[1].decode(), first, last, int(header[4])):
                if inbound.ask(time.monotonic()):
                    log.info("CLUSTER_GAP", node_id=origin, expected=inbound.expect, got=first)
                    gap = b"%s %s %d" % (self._header, header[1], inbound.expect)
                    self._publish(f"lobby.gap.{origin}", gap)
                return
            start = 1
        if left_out is None:
            left_out = []
        router = self.router
        registry = router.registry
        delivery = router.delivery
        actions: list[Action] = []
        for i in range(start, len(lines) - 1, 2):
            sender_line = lines[i]
            decided = sender_line.startswith(_DECIDED)
            sender_id = (sender_line[1:] if decided else sender_line).decode()
            if decided and sender_id == LOBBY_ID:  # a notice: nobody to confirm it to
                delivered = router.decided(None, lines[i + 1])
                if delivered is None:
                    left_out.append((sender_id, _message_id(lines[i + 1])))
                else:
                    actions += delivered
                continue
            agent = registry.get(sender_id)
            if agent is None:
                if sender_id != looked_up and self.learn is not None:
                    # Registered elsewhere a moment ago, not yet watched here: this node's
                    # link waits while its entry is read, so nothing overtakes this message.
                    self._execute(actions)
                    self._stalled[origin] = []
                    self._spawn(self._learn_then_route(origin, data, i, sender_id, left_out))
                    return
                log.warning("CLUSTER_SENDER_UNKNOWN", agent_id=sender_id, node_id=origin)
                left_out.append((sender_id, _message_id(lines[i + 1])))
                continue
            session = self._sessions.get((origin, sender_id))
            if session is None:
                link = NodeLink(self.returns, origin, sender_id)
                session = router.open(remote=link.remote, link=link)
                self._sessions[(origin, sender_id)] = session
            session.agent = agent
            queued = len(delivery.forwards)
            try:
                if decided:
                    delivered = router.decided(session, lines[i + 1])
                    if delivered is None:  # its receiver is not this node's agent any more
                        left_out.append((sender_id, _message_id(lines[i + 1])))
                        continue
                    actions += delivered
                else:
                    actions += router.relayed(session, lines[i + 1])
            except Exception:
                log.exception("ROUTER_FAILED", session=session.id)
            if len(delivery.forwards) > queued:
                # What this node decided (a move of a dialogue it holds, its notices) goes on;
                # a message it would only pass on again never does (no second hop): its
                # receiver's home is another node now.
                passed = [f for f in delivery.forwards[queued:] if not f[5]]
                if passed:
                    left_out += [(f[2], f[3]) for f in passed]
                    delivery.forwards[queued:] = [f for f in delivery.forwards[queued:] if f[5]]
        self._execute(actions)
        done = b"%s %s %d %d\n%s" % (self._header, header[1], first, last, orjson.dumps(left_out))
        self._durable(lambda: self._publish(f"lobby.done.{origin}", done))

    async def _learn_then_route(
        self, origin: str, data: bytes, start: int, sender_id: str, left_out: list[tuple[str, str]]
    ) -> None:
        """Read `sender_id`'s entry, then route the rest of `data` and what `origin`
        forwarded meanwhile, in order (stopping again at the next sender not known)."""
        assert self.learn is not None
        try:
            await self.learn(sender_id)
        except Exception:  # NATS away: routed as unknown, kept by its node and resent
            log.exception("CLUSTER_LOOKUP_FAILED", agent_id=sender_id)
        waiting = self._stalled.pop(origin)
        self._route_forwarded(origin, data, start, sender_id, left_out)
        for n, later in enumerate(waiting):
            if origin in self._stalled:  # stopped again: the rest waits behind that one
                self._stalled[origin][:0] = waiting[n:]
                return
            self._route_forwarded(origin, later)

    async def _returned(self, msg: Msg) -> None:
        lines = msg.data.split(b"\n")
        agents = self.router.registry.agents
        actions: list[Action] = []
        for i in range(1, len(lines) - 1, 2):
            record = agents.get(lines[i].decode())
            # An agent gone offline meanwhile misses an ERROR: it resends, and the home's
            # dedupe or its refusal answers the resend.
            if record is not None and record.session is not None and record.home is None:
                actions.append(Send(record.session, lines[i + 1]))
        self._execute(actions)

    async def _done(self, msg: Msg) -> None:
        header, _, rest = msg.data.partition(b"\n")
        home_b, incarnation, first, last = header.split(b" ")
        link = self.links.get(home_b.decode())
        if link is None or incarnation.decode() != self.incarnation:
            return  # meant for an earlier process of this node
        left_out = orjson.loads(rest) if rest and rest != b"[]" else ()
        settled = link.confirmed(int(first), int(last), ((s, m) for s, m in left_out))
        if settled:
            self._execute(self.router.stored_away(settled))

    async def _gap(self, msg: Msg) -> None:
        home_b, incarnation, first = msg.data.split(b" ")
        home = home_b.decode()
        if home in self.links and incarnation.decode() == self.incarnation:
            log.info("CLUSTER_GAP_RESENT", node_id=home, from_batch=int(first))
            self._resend(home, int(first))

    async def _pinged(self, msg: Msg) -> None:
        await msg.respond(b"")


def _message_id(frame: bytes) -> str:
    """The message_id of a forwarded frame (rare path: a sender this node does not know)."""
    try:
        return str(orjson.loads(frame).get("message_id"))
    except (orjson.JSONDecodeError, AttributeError):
        return ""
