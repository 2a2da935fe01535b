"""Messages between lobby nodes, over core NATS.

The sender's node authenticates a message and checks it against the shared registry (the
capability, its authorization, the conversation) as for a local receiver; when the receiver's
connection is on another node (its home) the core queues the message (`Delivery.forwards`)
instead of storing it. Once per pass of the loop this node publishes what it queued, one NATS
message per destination node, on `lobby.fwd.<home>`.

The home routes each forwarded message as its own (`Router.relayed`): it checks it again,
dedupes it by (sender, message_id), stamps its `seq`, stores and delivers it. The sender is
stood for there by a relay session whose link is `NodeLink`: whatever the home answers it,
an ERROR at once or ACCEPTED after the home's commit, is published back on
`lobby.ret.<sender's node>` (one NATS message per node per pass) and written to the sender's
connection there. So a cross-node message is ACCEPTED only once its home has committed it,
and a resend after a lost answer is absorbed by the home's dedupe.

Wire form of both subjects: lines of UTF-8, the first this node's id, then pairs of lines
(an agent id, a frame). Frames are single-line JSON (orjson writes no newline), so nothing is
decoded or encoded again on the way.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Iterable
from typing import Any

import structlog
from nats.aio.client import Client
from nats.aio.msg import Msg

from lobby.core.router import Router
from lobby.core.session import Action, Send, Session

log = structlog.get_logger("lobby.cluster")


class NodeLink:
    """The link of a relay session: frames written to it go back to the node the sender is
    on, gathered until the server's flush at the end of the pass."""

    def __init__(self, relay: Relay, node_id: str, agent_id: str) -> None:
        self.node_id = node_id
        self.remote = f"node {node_id}"
        self._agent = agent_id.encode()
        self._returns = relay.returns

    def put(self, frame: bytes) -> bool:
        lines = self._returns.get(self.node_id)
        if lines is None:
            lines = self._returns[self.node_id] = []
        lines.append(self._agent)
        lines.append(frame)
        return True

    def flush(self) -> int:
        return 0  # the relay publishes what was put, per node, in its `kick`

    def shut(self, code: int, reason: str) -> None:
        return None

    def pause(self, seconds: float) -> None:
        return None  # rate limits are the sender's node's: it paused the sender's connection


class Relay:
    """Forwards this node's queued messages and routes the ones forwarded to it. `start`
    subscribes; `kick` after each pass; `stop` waits for the publishes in flight."""

    def __init__(
        self, node_id: str, router: Router, execute: Callable[[Iterable[Action]], None]
    ) -> None:
        self.node_id = node_id
        self.router = router
        self._execute = execute
        self._nc: Client | None = None
        self._sessions: dict[tuple[str, str], Session] = {}
        """(node, agent id) -> the relay session standing for that agent of that node."""
        self._tasks: set[asyncio.Task[None]] = set()
        self._header = node_id.encode()
        self.returns: dict[str, list[bytes]] = {}
        """Node -> (agent id, frame) lines answering its agents, published by `kick`."""

    async def start(self, nc: Client) -> None:
        self._nc = nc
        await nc.subscribe(f"lobby.fwd.{self.node_id}", cb=self._forwarded)
        await nc.subscribe(f"lobby.ret.{self.node_id}", cb=self._returned)

    async def stop(self) -> None:
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
        by_node: dict[str, list[bytes]] = {}
        for home, sender, frame in forwards:
            lines = by_node.setdefault(home, [self._header])
            lines.append(sender.encode())
            lines.append(frame)
        for home, lines in by_node.items():
            self._publish(f"lobby.fwd.{home}", b"\n".join(lines))

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
        lines = msg.data.split(b"\n")
        origin = lines[0].decode()
        router = self.router
        registry = router.registry
        actions: list[Action] = []
        for i in range(1, len(lines) - 1, 2):
            sender_id = lines[i].decode()
            agent = registry.get(sender_id)
            if agent is None:
                # The sender's registration has not reached this node yet: unanswered, the
                # message is not ACCEPTED, and the sender resends it.
                log.warning("CLUSTER_SENDER_UNKNOWN", agent_id=sender_id, node_id=origin)
                continue
            session = self._sessions.get((origin, sender_id))
            if session is None:
                link = NodeLink(self, origin, sender_id)
                session = router.open(remote=link.remote, link=link)
                self._sessions[(origin, sender_id)] = session
            session.agent = agent
            try:
                actions += router.relayed(session, lines[i + 1])
            except Exception:
                log.exception("ROUTER_FAILED", session=session.id)
        self._execute(actions)

    async def _returned(self, msg: Msg) -> None:
        lines = msg.data.split(b"\n")
        agents = self.router.registry.agents
        actions: list[Action] = []
        for i in range(1, len(lines) - 1, 2):
            record = agents.get(lines[i].decode())
            # An agent gone offline meanwhile misses an ACCEPTED: it resends, and the home's
            # dedupe confirms the resend.
            if record is not None and record.session is not None and record.home is None:
                actions.append(Send(record.session, lines[i + 1]))
        self._execute(actions)
