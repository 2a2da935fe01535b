"""The lobby's I/O layer: one `LobbyServer` drives the router, the store and the clock; a
transport carries the connections, behind the interfaces of `lobby.transport.base`: websockets
(the default: `lobby.transport.websockets_server`), picows (`--transport picows`) or memory (no
sockets: tests, embedding). Only the transports import a WebSocket library, and none of them
imports this module.

A transport hands each message to `received` as its parser produces it, inside the read that
brought it (no receive queue, no task switch per message), and calls `end_of_batch` when that
read is done. The lobby never awaits on a receiver: a `Send` frames the message on the
receiver's `Link`, and `end_of_batch` flushes every link written to, one write for a burst
(`lobby.outbound`). The bytes that wait in a link are that connection's outbound queue. Delivery
is paced by it (`lobby.pacing`, `lobby.core.delivery`): past `outbound_window` bytes, the agent
is `paced` and what is sent to it is held in its mailbox; the transport calls `drained` once the
queue falls to `outbound_low_water`, and the held messages are written, oldest first, while the
queue stays within the window. So a slow reader gets its backlog at its own speed, and a live
message never overtakes a held one. A receiver that stops reading is still closed with 4002
rather than slowing its senders: once its queue plus what arrived for it while connected and is
held pass `max_outbound_bytes`. (A writer task per connection would cost a task switch per
message; the transport's own buffer and its flow-control callbacks give the same for free.)
Closes run as tracked tasks, awaited on shutdown.

DISCOVER_SERVICES are answered by a worker process holding a replica of the search index
(`lobby.discovery_worker`), off this loop, unless `--no-discovery-worker`: then, as while the
worker starts, one per pass of the loop, after the messages that pass routed.

HTTP on the same port is answered by `lobby.endpoints`. `/admin` is the operators' WebSocket
(`lobby.admin_endpoint`), opened with the admin token; its observers (`lobby.observer`) are
told of each routed message, at the cost of one test per message while nobody observes.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import structlog

from lobby import admin_endpoint, stepdown
from lobby.admin_endpoint import AdminEndpoint
from lobby.committer import Committer
from lobby.config import Settings
from lobby.core.counters import SECONDS, Buckets
from lobby.core.router import Router
from lobby.core.session import Session
from lobby.discovery_worker import DiscoveryWorker
from lobby.endpoints import Endpoints
from lobby.identity import kept_identity, new_identity
from lobby.metrics import Metrics
from lobby.observer import Observers
from lobby.outbound import Outbound
from lobby.pacing import Pacer
from lobby.store import SqliteStore, Store, open_store
from lobby.store.base import StoreFenced
from lobby.transport.base import HttpAnswer, Link, Transport

if TYPE_CHECKING:
    from lobby.cluster.node import ClusterNode
from protocol.models import LOBBY_ID, CloseCode

log = structlog.get_logger("lobby.server")

FLUSH_EVERY = 16
"""A long read is flushed every this many messages, not only at its end: its first messages
go out (and their answers start) while the rest are routed. Fewer means more write() calls
per message; more leaves a lone peer idle while a long read is routed."""


class LobbyServer(Outbound):
    """One lobby process: `await start()`, then `await stop()` (or `serve_until(event)`).

    `transport` defaults to the one `settings.transport` names; a `MemoryTransport` (from
    `lobby.transport.memory`) serves clients in this process, without sockets."""

    def __init__(
        self,
        settings: Settings,
        router: Router | None = None,
        store: Store | None = None,
        transport: Transport | None = None,
    ) -> None:
        self.settings = settings
        self.transport_settings = settings.for_transport()
        self.router = router or Router(
            limits=settings.limits(),
            trace=settings.log_level.lower() == "debug",
            dialogue_timeout=settings.dialogue_timeout,
            mailbox_limit=settings.mailbox_limit,
            dedupe_horizon=settings.dedupe_horizon,
            dedupe_max=settings.dedupe_max,
            delivery_window=settings.outbound_window,
            tracing=settings.tracing(),
        )
        self.store: Store = store or open_store(settings.for_store())
        try:
            self.identity = (
                kept_identity(self.store.path.parent)
                if isinstance(self.store, SqliteStore)
                else new_identity()
            )
            """This lobby's identity (`lobby.identity`); a cluster's replaces it at start."""
        except BaseException:
            self.store.close()
            raise
        self.committer = Committer(
            self.store,
            self.router,
            self._execute,
            interval=settings.commit_interval,
            failed=self._commit_failed,
        )
        self.transport = transport or _transport(settings.transport)
        self.cluster: ClusterNode | None = None
        """`--cluster`: this node's part in the registry the nodes share (lobby.cluster)."""
        if settings.cluster is not None and settings.node_id is not None:
            from lobby.cluster.node import ClusterNode  # nats-py: the cluster extra

            self.cluster = ClusterNode(
                settings.cluster_urls(),
                settings.node_id,
                self.router,
                self.execute_now,
                durable=self.committer.after_durable,
                flush=self.committer.flush,
                replicas=settings.cluster_replicas,
                fenced=self.fence,
                epoch=int(getattr(self.store, "epoch", 0)),
                dead_after=settings.cluster_dead_after,
            )
        self.fenced: str | None = None
        """Why this node stepped down (`fence`): it serves nobody until `lobby serve` starts
        it again under a new epoch."""
        self.unstored = False
        """Stepped down because its own commit failed (not fenced by another process)."""
        self.stepped_down = asyncio.Event()
        """Set by `fence`: what `lobby serve` waits for, besides a signal."""
        self._running = False
        self._port: int | None = None
        """The bound port; None before start, and for a transport without one (memory)."""
        self._compactor: asyncio.Task[None] | None = None
        self._ticker: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._deadlines: dict[Session, asyncio.TimerHandle] = {}
        """Connections that have not registered yet: closed with 1008 when it runs out."""
        self.connections = 0
        self._started = time.monotonic()
        self._delivery = self.router.delivery
        self._window = settings.outbound_window
        """Bytes in a connection's outbound queue past which its agent is paced."""
        self._pacer = Pacer(
            self._delivery,
            window=self._window,
            limit=settings.max_outbound_bytes,
            too_slow=self._too_slow,
        )
        self._written: dict[Link, Session] = {}
        """Links with frames waiting to be flushed at the end of this batch."""
        self._batch_due = False
        self._unflushed = 0
        self._query_due = False
        """Messages routed since the last flush."""
        self._stopping = False
        self._batch_started = 0.0
        self.batch_seconds = Buckets(SECONDS)
        """Per batch of messages from a read: its first message in -> its frames written."""
        self.metrics = Metrics(self)
        self.endpoints = Endpoints(self)
        self._admin_sessions: set[Session] = set()
        self.admin: AdminEndpoint | None = None
        self.observers = Observers(self)
        self.discovery = DiscoveryWorker(self) if settings.discovery_worker else None
        """Answers DISCOVER_SERVICES in a worker process, when the setting is on."""
        self._changes = self.router.registry.changes
        """What the worker has yet to be sent (stays empty without one)."""
        self._observing = self.observers.sessions
        """Tested per routed message: the observers are told only when there are some."""
        """The /admin endpoint; made at start, with the admin token."""

    @property
    def port(self) -> int:
        """The bound port (useful with `port=0`). The memory transport has none: its clients
        come through `MemoryTransport.connect()`."""
        assert self._running, "start() first"
        if self._port is None:
            raise RuntimeError(f"the {self.transport.name} transport listens on no port")
        return self._port

    @property
    def url(self) -> str:
        """Where agents connect: `ws://HOST:PORT/` (`wss://` with TLS); `memory://global_lobby/`
        on the memory transport, which no WebSocket client can open."""
        assert self._running, "start() first"
        if self._port is None:
            return f"{self.transport.name}://{LOBBY_ID}/"
        scheme = "wss" if self.settings.tls_cert else "ws"
        return f"{scheme}://{self.settings.host}:{self._port}/"

    async def start(self) -> None:
        s = self.settings
        self.router.restore(self.store.load())
        data_dir = self.store.path.parent if isinstance(self.store, SqliteStore) else None
        token, where = admin_endpoint.choose_token(s.admin_token, data_dir)
        self.admin = AdminEndpoint(self, token, self._admin_sessions, where=where)
        try:
            if self.cluster is not None:
                await self.cluster.start()
                self.identity = self.cluster.identity
            self.router.state.identity = self.identity
            self._port = await self.transport.start(self)
        except BaseException:
            if self.cluster is not None:
                await self.cluster.stop()
            await self.committer.close()  # a lobby that could not listen lets go of its store
            raise
        if s.admin_token is None:
            admin_endpoint.publish_token(token, data_dir)
        self._running = True
        self._started = time.monotonic()
        self._compactor = asyncio.create_task(self._compact_periodically())
        self._ticker = asyncio.create_task(self._tick_periodically())
        log.info(
            "LOBBY_LISTENING",
            lobby_id=LOBBY_ID,
            lobby_identity=self.identity,
            host=s.host,
            port=self._port,
            url=self.url,
        )

    async def stop(self) -> None:
        """Close every connection with 1001 and stop listening, within `shutdown_timeout`: the
        transport writes every close frame in one pass and waits once for all the peers
        (`Transport.stop`); their agents go offline quietly, one LOBBY_CLOSING line for all."""
        if not self._running:
            return
        self._stopping = True
        self.router.addressed.paused = True  # what providers hold stays theirs, no failover
        log.info("LOBBY_CLOSING", connections=self.connections)  # for every agent going quiet
        if self.discovery is not None:
            await self.discovery.close()  # answers nobody waits for now
        try:
            async with asyncio.timeout(self.settings.shutdown_timeout):
                await self.transport.stop()
                if self._tasks:
                    await asyncio.gather(*self._tasks, return_exceptions=True)
        except TimeoutError:
            log.warning("LOBBY_SHUTDOWN_TIMEOUT", pending_closes=len(self._tasks))
            for task in self._tasks:
                task.cancel()
        for background in (self._compactor, self._ticker):
            if background is not None:
                background.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await background
        self.observers.close()
        if self.cluster is not None:
            await self.cluster.stop(clean=self.fenced is None)
        await self.committer.close()
        self._running = self._stopping = False
        self.router.addressed.paused = False
        self._port = None
        log.info("LOBBY_STOPPED")

    async def serve_until(self, stop: asyncio.Event) -> None:
        await self.start()
        try:
            await stop.wait()
        finally:
            await self.stop()

    # -- what transports call -------------------------------------------------------------

    def admit(self, path: str, authorization: str | None = None) -> HttpAnswer | None:
        """The answer to an HTTP request for `path`, or None to accept the WebSocket."""
        return self.endpoints.admit(path, authorization)

    def connected(self, link: Link, host: str, path: str = "/") -> Session:
        """A WebSocket is open: it has `handshake_timeout` to REGISTER (an /admin one needs
        not if it was authenticated by `admit`, else it has that long to send the token)."""
        session = self.router.open(remote=link.remote, link=link, host=host)
        self.connections += 1
        path, _, query = path.partition("?")
        if path != admin_endpoint.PATH or self.admin is None:
            self._arm(session, self._registration_deadline)
        elif self.admin.opened(session, query):
            self._arm(session, self._admin_deadline)
        return session

    def _arm(self, session: Session, deadline: Callable[[Session], None]) -> None:
        self._deadlines[session] = asyncio.get_running_loop().call_later(
            self.settings.handshake_timeout, deadline, session
        )

    def received(self, session: Session, binary: bool, data: bytes) -> None:
        """One message from `session`, from within a read. The transport calls `end_of_batch`
        when the read is done, so what it produced goes out at once; one is scheduled as well,
        in case the transport never reports that end (picows answers a ping that ends a read
        without handing it over), so the committer still sees the journal soon."""
        if not self._unflushed:
            self._batch_started = time.perf_counter()
        registering = session.agent is None
        if registering and session in self._admin_sessions:
            assert self.admin is not None
            self.admin.received(session, binary, data)
            return
        if self.fenced is not None:
            # An ERROR `node_unavailable` to one not registered; a registered one is being
            # closed, and what it sends now is not ACCEPTED: it resends it after its resume.
            if registering:
                self._send(session, stepdown.refusal(data))
            return
        router = self.router
        try:
            actions = router.binary(session) if binary else router.handle(session, data)
        except Exception:
            # A bug in the core must cost this one message, not the connection.
            log.exception("ROUTER_FAILED", session=session.id)
            actions = router.failed(session)
        if actions:
            self._execute(actions)
            if registering and session.agent is not None:
                self._cancel_deadline(session)
        if self._observing:
            self.observers.routed(session, data, actions)
        self._batch()
        self._unflushed += 1
        if self._unflushed >= FLUSH_EVERY:
            self.end_of_batch()

    def end_of_batch(self) -> None:
        """Flush what was framed for each link in one write, and let the committer see the
        journal."""
        self._batch_due = False
        routed, self._unflushed = self._unflushed, 0
        written, self._written = self._written, {}
        window = self._window
        for link, session in written.items():
            try:
                waiting = link.flush()
            except Exception:
                log.debug("SEND_FAILED", exc_info=True)
                continue
            if waiting > window:
                self._pacer.flushed(session, waiting)
        if self._delivery.paced:
            self._pacer.held()
        if routed:
            self.batch_seconds.observe(time.perf_counter() - self._batch_started)
        self.committer.kick()
        if self.cluster is not None:
            self.cluster.kick()
        if self._changes and self.discovery is not None:
            self.discovery.feed()
        self.queries_waiting()

    def drained(self, session: Session) -> None:
        """The outbound queue of `session`, once past the window, fell to the low-water mark:
        write what is held for its agent."""
        if self._pacer.drained(session):
            self._batch()  # the committer sees what was delivered

    def queries_waiting(self) -> None:
        """Make sure a waiting DISCOVER_SERVICES is answered (or handed to the worker) soon."""
        if self.router.queries and not self._query_due:
            self._query_due = True
            asyncio.get_running_loop().call_soon(self._answer_query)

    def closing(self, session: Session, code: int | None) -> None:
        """The connection of `session` stopped being open (its peer sent a close frame, or the
        transport failed it: 1009, 1002, ...), though TCP may stay up a while: its agent goes
        offline now, what is sent to it from here on held for its resume. The transport aborts
        the connection if the closing handshake does not finish in time."""
        self._execute(self.router.close(session, code, quiet=self._stopping))

    def disconnected(self, session: Session, code: int | None = None) -> None:
        """The connection of `session` is gone (TCP closed or aborted)."""
        self._cancel_deadline(session)
        self.connections -= 1
        if self.admin is not None:
            self.admin.closed(session)
        self._execute(self.router.close(session, code, quiet=self._stopping))
        self._batch()

    def _answer_query(self) -> None:
        self._query_due = False
        if self.discovery is not None and self.discovery.dispatch():
            return
        self.answer_in_process()

    def answer_in_process(self) -> None:
        """Answer one waiting DISCOVER_SERVICES here, then let the loop poll again: every pass
        reads and routes what arrived before the next query is answered, so an agent's
        REQUEST waits for at most one query, however many are queued."""
        if not self.router.queries:
            return
        session = self.router.queries[0].session
        try:
            actions = self.router.answer_query()
        except Exception:
            log.exception("ROUTER_FAILED", session=session.id)
            actions = self.router.failed(session)
        self._execute(actions)
        self.end_of_batch()

    def _commit_failed(self, error: BaseException | None) -> bool:
        """A commit failed. A cluster node steps down (True): fenced by another, or its
        memory is now ahead of its journal (NATS away past the write deadline), and only a
        start from the journal is sound again. A single lobby goes on (False)."""
        if isinstance(error, StoreFenced):
            self.fence(str(error))
            return True
        if self.cluster is None:
            return False
        self.unstored = True
        self.fence(f"a commit failed ({error!r}): this node rejoins from what it stored")
        return True

    def fence(self, reason: str) -> None:
        """Another node claimed this one (it failed it over, or a second process took its node
        id): stop serving at once. Every agent's connection is closed with 1012 (the SDK
        resumes on another node), REGISTER is refused with `node_unavailable`, /readyz says
        why; `lobby serve` then stops this server and starts a new one (`lobby.cli`)."""
        if self.fenced is not None or not self._running or self._stopping:
            return
        self.fenced = reason
        log.error("CLUSTER_FENCED", node_id=self.settings.node_id, reason=reason)
        for agent in list(self.router.registry.agents.values()):
            if agent.session is not None:
                self._close(agent.session, CloseCode.SERVICE_RESTART, stepdown.REJOINING)
        self.stepped_down.set()

    def _cancel_deadline(self, session: Session) -> None:
        """The connection's deadline (to register, or to prove an admin token) is off, at once:
        a timer per connection held `handshake_timeout` would pile up while a fleet registers."""
        deadline = self._deadlines.pop(session, None)
        if deadline is not None:
            deadline.cancel()

    def _registration_deadline(self, session: Session) -> None:
        self._deadlines.pop(session, None)
        shared = self.router.state.shared
        if session.agent is None and shared is not None and shared.registering(session):
            # Its REGISTER came and waits on the cluster (a failover, say), which bounds that.
            self._arm(session, self._registration_deadline)
        elif session.agent is None:
            self._close(session, CloseCode.POLICY_VIOLATION, "no REGISTER in time")

    def _admin_deadline(self, session: Session) -> None:
        self._deadlines.pop(session, None)
        if self.admin is not None and session in self.admin.unproven:
            self._close(session, CloseCode.POLICY_VIOLATION, "no admin token in time")

    async def _tick_periodically(self) -> None:
        """Deadlines (dialogue expiry) are checked twice a second."""
        while True:
            await asyncio.sleep(0.5)
            try:
                actions = self.router.tick()
                self._execute(actions)
                if self._observing:
                    self.observers.noticed(actions)
            except Exception:
                log.exception("TICK_FAILED")
            self.committer.kick()

    async def _compact_periodically(self) -> None:
        while True:
            await asyncio.sleep(self.settings.compact_interval)
            try:
                await self.committer.compact(self.router.compaction())
            except Exception:
                log.exception("STORE_COMPACTION_FAILED")

    def readiness(self) -> HttpAnswer:
        return self.endpoints.readiness()

    def health(self) -> dict[str, object]:
        return self.endpoints.health()

    def listening(self) -> bool:
        return self._running and not self._stopping

    def uptime(self) -> float:
        return time.monotonic() - self._started


def _transport(name: str) -> Transport:
    if name == "picows":
        from lobby.transport.picows import PicowsTransport  # an optional dependency

        return PicowsTransport()
    from lobby.transport.websockets_server import WebsocketsTransport

    return WebsocketsTransport()


__all__ = ["LobbyServer", "Session"]
