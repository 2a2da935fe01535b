"""One lobby node's part in the shared registry: KV bucket `agents` (`lobby.cluster.keys`).

The core stays sans-I/O (`lobby.core.cluster.shared`); this class carries its cluster work out on
the lobby's own event loop, over a NATS connection of its own (the journal's lives in the
committer's thread, `lobby.store.jetstream`):
- a REGISTER of a new id is one `kv.create`; REGISTER_ACK (or `agent_id_taken` when another
  node created the key first) is sent only when NATS has answered. A create whose answer was
  lost is settled by reading the key back: the token hash says whose it is.
- a resume, UPDATE_CAPABILITIES, UNREGISTER and an operator's revoke/remove are
  compare-and-set writes (`kv.update` / `kv.delete` with the last revision
  this node saw). One write is in flight per key, in the order the core made them; a conflict
  re-reads the key and writes again on top of it, unless it was deleted meanwhile.
- every node watches the whole bucket into its core (`Router.learned` / `Router.forgot`), so
  DISCOVER is answered from memory and lists the agents of every node, and a node that sees
  an agent's key written by another node (the agent resumed there) closes its own connection
  of that agent with 4001. While a write of a key is in flight, watch entries of that key wait
  until it is settled: the node acts on the newest state, not on one it is overwriting. At
  start the node reads the bucket to its end before it listens. Its own writes come back
  through the watch and are skipped by revision.

Throughput is not a concern here: registrations are rare next to messages, and nothing in this
module runs on the REQUEST/RESPONSE path.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine, Iterable
from typing import Any, Final

import nats
import nats.errors
import nats.js.errors
import structlog
from nats.aio.client import Client
from nats.js.kv import KeyValue

from lobby.cluster import steps
from lobby.cluster.handovers import HANDOVERS, Handovers
from lobby.cluster.keys import AGENTS, agent_id_of, agent_key, decode_agent, encode_agent
from lobby.cluster.liveness import DEAD_AFTER, NODES, Liveness
from lobby.cluster.presence import PresenceLink
from lobby.cluster.recovery import RECOVERIES, Recovery
from lobby.cluster.routing import Relay
from lobby.core.cluster.shared import Claim
from lobby.core.records import AgentRemoved, AgentSaved
from lobby.core.router import Router
from lobby.core.session import Action
from lobby.identity import new_identity
from lobby.store.base import StoreUnavailable
from lobby.store.jetstream import once_answered, replicated

log = structlog.get_logger("lobby.cluster")

_FAILED = (nats.errors.Error, TimeoutError)
"""What a KV call raises when NATS does not answer in time or refuses for another reason."""
_CONFLICTS = 8
"""Compare-and-set conflicts one registration change tolerates before it gives up (each means
another node wrote the same agent meanwhile)."""
_RETRY_WAIT = 0.5
PING_INTERVAL: Final = 1.0
"""Seconds between this node's pings to its NATS server (nats-py's default is 2 minutes)."""
MISSED_PINGS: Final = 3
"""Pings left unanswered after which the server counts as gone and another is tried."""
DELETED = ("DEL", "PURGE")
LOBBY: Final = "lobby"
"""The KV bucket of facts about the whole cluster: key `identity`, the lobby identity every
node announces (`lobby.identity`), made by the first node ever to start."""

Change = AgentSaved | AgentRemoved


class ClusterUnavailable(StoreUnavailable):
    """NATS could not be reached or the bucket set up at start (`lobby serve`: one line)."""


class ClusterNode:
    """Made by the server for `--cluster`; `await start()` before listening, `kick()` after
    each batch the core handled (it takes the core's claims and changes), `await stop()` last.
    `execute` carries out the actions the core returns for what NATS answered."""

    def __init__(
        self,
        servers: list[str],
        node_id: str,
        router: Router,
        execute: Callable[[Iterable[Action]], None],
        *,
        durable: Callable[[Callable[[], None]], None],
        flush: Callable[[], Awaitable[None]],
        connect_timeout: float = 2.0,
        replicas: int = 1,
        fenced: Callable[[str], None] = lambda reason: None,
        epoch: int = 0,
        dead_after: float = DEAD_AFTER,
    ) -> None:
        self.servers = servers
        self.replicas = replicas
        """Copies NATS keeps of each bucket (`--cluster-replicas`)."""
        self.node_id = node_id
        self.router = router
        self.shared = router.share(node_id)
        self._execute = execute
        self._connect_timeout = connect_timeout
        self._nc: Client | None = None
        self._kv: KeyValue | None = None
        self._revisions: dict[str, int] = {}
        """Key -> the newest revision this node wrote or saw: older watch entries are echoes."""
        self._creating: set[str] = set()
        """Keys with a create in flight."""
        self._held: dict[str, list[KeyValue.Entry]] = {}
        """Keys with a write in flight -> watch entries that arrived meanwhile, applied once
        it is settled: the core must not act on a state this node is about to overwrite (close
        an agent's new connection here for an older one elsewhere)."""
        self._queues: dict[str, deque[Change]] = {}
        """Key -> changes waiting to be written, the first one in flight."""
        self._tasks: set[asyncio.Task[None]] = set()
        self._watching: asyncio.Task[None] | None = None
        self._stopping = False
        self.identity = new_identity()
        """The cluster's lobby identity, read from (or first written to) KV `lobby` at start."""
        self.liveness = Liveness(node_id, dead_after)
        """Which nodes are alive (KV bucket `nodes`)."""
        self.relay = Relay(node_id, router, execute, durable)
        """Messages to and from agents on other nodes."""
        self.relay.learn = self.learn
        self.presence = PresenceLink(node_id, router, execute, self.liveness.alive)
        """Which agents are connected to which node (`lobby.presence`)."""
        self.handovers = Handovers(node_id, router, execute, durable, replicas=replicas)
        """Agents handed over between this node and another live one."""
        self.recovery = Recovery(
            node_id,
            servers,
            router,
            self.liveness,
            execute,
            self.relay.rehome,
            flush,
            probe=self.relay.probe,
            fenced=fenced,
            epoch=epoch,
            reclaim=self.handovers.reclaim,
        )
        """Failover of dead nodes (KV bucket `recoveries`), and noticing this one fenced."""

    async def start(self) -> None:
        """Connect, open (or create) the bucket and read it to its end into the core."""
        where, replicas = ", ".join(self.servers), self.replicas
        try:
            self._nc = await nats.connect(
                self.servers,
                name=f"lobby-{self.node_id}-cluster",
                connect_timeout=self._connect_timeout,
                max_reconnect_attempts=-1,
                reconnect_time_wait=0.5,
                # A server that stalls (paused, overloaded) keeps its TCP connection open:
                # unanswered pings tell within about PING_INTERVAL * MISSED_PINGS, so this
                # node moves to another server well before anyone may judge it dead.
                ping_interval=PING_INTERVAL,
                max_outstanding_pings=MISSED_PINGS,
                error_cb=_quiet,
                disconnected_cb=self._disconnected,
            )
            js = self._nc.jetstream()
            buckets = (AGENTS, NODES, RECOVERIES, LOBBY)
            await _until_led(js, [*(f"KV_{b}" for b in buckets), f"OBJ_{HANDOVERS}"])

            async def agents() -> KeyValue:
                try:
                    return await js.key_value(AGENTS)
                except nats.js.errors.BucketNotFoundError:
                    return await js.create_key_value(bucket=AGENTS, history=1, replicas=replicas)

            # Again while its stream has no leader yet: a NATS cluster restarted with this node
            # elects one per stream from what it kept, which takes seconds.
            self._kv = await once_answered(agents)
            watcher = await self._kv.watchall()
            while (entry := await _next(watcher, 30)) is not None:
                self._apply(entry)
            self.identity = await _shared_identity(js, replicas)
            await self.liveness.start(js, replicas)
            await self.relay.start(self._nc)
            await self.handovers.start(self._nc)
            await self.presence.start(self._nc)
            await self.recovery.start(js, replicas)
            for bucket in (AGENTS, NODES, RECOVERIES, LOBBY):
                await replicated(js, f"KV_{bucket}", replicas)
            await replicated(js, f"OBJ_{HANDOVERS}", replicas)
        except (OSError, *_FAILED) as exc:
            await self.stop()
            raise ClusterUnavailable(f"cannot set up the agents bucket at {where}: {exc}") from None
        self._watching = asyncio.create_task(self._watch(watcher))
        log.info("CLUSTER_JOINED", node_id=self.node_id, agents=len(self.router.registry))

    async def _disconnected(self) -> None:
        if not self._stopping:
            self.liveness.lost()

    async def stop(self, clean: bool = True) -> None:
        """Finish the writes in flight (bounded by the server's shutdown), then disconnect;
        `clean` False (stepping down to rejoin) keeps this node's key in `nodes`."""
        self._stopping = True
        if self._watching is not None:
            self._watching.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watching
        await self.recovery.stop()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.relay.stop()
        await self.handovers.stop()
        await self.presence.stop()
        await self.liveness.stop(clean)
        if self._nc is not None and not self._nc.is_closed:
            # RuntimeError: nats-py flushing onto a transport uvloop already closed (NATS went
            # away meanwhile); there is nothing left to flush to.
            with contextlib.suppress(*_FAILED, RuntimeError):
                try:
                    await self._nc.close()
                except asyncio.CancelledError:
                    # nats-py awaiting the close of a transport whose waiter was cancelled
                    # under it (NATS gone meanwhile): closed all the same. A cancellation of
                    # this task itself goes on.
                    task = asyncio.current_task()
                    if task is None or task.cancelling():
                        raise

    def kick(self) -> None:
        """Start writing what the core queued: each new claim, each change (per key, in order)."""
        self.relay.kick()
        self.presence.kick()
        probes = self.shared.probes
        if probes:
            for home in dict.fromkeys(probes):
                self._spawn(self._probe(home))
            probes.clear()
        releases = self.shared.releases
        if releases:
            for home, agent_id in releases:
                self._spawn(self._hand_over(home, agent_id))
            releases.clear()
        lookups = self.shared.lookups
        if lookups:
            for agent_id in lookups:
                self._spawn(self._lookup(agent_id))
            lookups.clear()
        claims, changes = self.shared.take()
        for claim in claims:
            self._spawn(self._create(claim))
        for change in changes:
            key = agent_key(change.agent_id)
            queue = self._queues.get(key)
            if queue is not None:
                queue.append(change)
            else:
                self._queues[key] = deque([change])
                self._held.setdefault(key, [])
                self._spawn(self._write(key))

    async def _probe(self, home: str) -> None:
        """Is `home` up? The resumes of its agents waiting here go ahead or are closed."""
        alive = await self.relay.probe(home)
        # A node stopped cleanly (its key deleted, not expired) is not failed over: its agents
        # may move on without what it holds for them, as before it had a failover.
        stopped = home not in self.liveness.heard
        self._execute(self.router.probed(home, alive or stopped))

    async def _hand_over(self, home: str, agent_id: str) -> None:
        """Have `home` hand `agent_id` over; its resumes waiting here then go ahead."""
        data = await self.handovers.ask_release(home, agent_id)
        if data is None and home not in self.liveness.heard:
            data = b""  # stopped cleanly: what it holds for the agent waits for its restart
        actions = self.router.handed_over(home, agent_id, data)
        if data:
            steps.reached("handover_adopted")
            self.handovers.adopted(home, agent_id)
        self._execute(actions)
        if data is not None:
            # What this node forwarded to the old home for the agent and it did not confirm
            # is routed here now, ahead of anything sent to the agent from now on.
            self.relay.rehome(agent_id, home, None)

    async def _lookup(self, agent_id: str) -> None:
        """A message here names an agent this node has not learned of: read its entry (it
        may have registered on another node a moment ago), then route or refuse what waits."""
        await self.learn(agent_id)
        self._execute(self.router.looked_up(agent_id))

    async def learn(self, agent_id: str) -> None:
        """Read `agent_id`'s entry from the bucket into the core, if it holds one (a failed
        read is logged: the caller goes on as if it held none)."""
        assert self._kv is not None
        try:
            entry: KeyValue.Entry | None = await self._kv.get(agent_key(agent_id))
        except (nats.js.errors.KeyNotFoundError, nats.js.errors.KeyDeletedError):
            entry = None
        except _FAILED:
            log.warning("CLUSTER_LOOKUP_FAILED", agent_id=agent_id)
            entry = None
        if entry is not None:
            self._apply(entry)

    def _release(self, key: str) -> None:
        """No write of `key` in flight any more: apply what the watch brought meanwhile."""
        if key in self._creating or key in self._queues:
            return
        for entry in self._held.pop(key, []):
            self._apply(entry)

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # -- REGISTER: one create ----------------------------------------------------------------

    async def _create(self, claim: Claim) -> None:
        assert self._kv is not None
        saved = claim.saved
        key = agent_key(saved.agent_id)
        self._creating.add(key)
        self._held.setdefault(key, [])
        won: bool | None
        try:
            revision = await self._kv.create(key, encode_agent(saved, self.node_id))
            won = True
        except nats.js.errors.KeyWrongLastSequenceError:
            won, revision = False, 0
        except _FAILED:
            # The create may have landed with its answer lost: whose is the key now?
            won, revision = await self._settle(key, saved)
        self._creating.discard(key)
        if won:
            self._revisions[key] = max(revision, self._revisions.get(key, 0))
        self._execute(self.router.claimed(saved.agent_id, won))
        self._release(key)

    async def _settle(self, key: str, saved: AgentSaved) -> tuple[bool | None, int]:
        assert self._kv is not None
        try:
            entry = await self._kv.get(key)
        except (nats.js.errors.KeyNotFoundError, nats.js.errors.KeyDeletedError):
            return None, 0
        except _FAILED:
            log.warning("CLUSTER_REGISTER_UNSETTLED", agent_id=saved.agent_id)
            return None, 0
        if entry.value is not None and decode_agent(saved.agent_id, entry.value)[0] == saved:
            return True, entry.revision or 0
        return False, 0

    # -- changes: compare-and-set, one in flight per key -------------------------------------

    async def _write(self, key: str) -> None:
        queue = self._queues[key]
        try:
            while queue:
                try:
                    await self._write_one(key, queue[0])
                except _FAILED as exc:
                    log.warning("CLUSTER_WRITE_FAILED", key=key, error=repr(exc))
                    await asyncio.sleep(_RETRY_WAIT)
                    continue
                queue.popleft()
        finally:
            del self._queues[key]
            self._release(key)

    async def _write_one(self, key: str, change: Change) -> None:
        kv = self._kv
        assert kv is not None
        last = self._revisions.get(key, 0)
        for _ in range(_CONFLICTS):
            try:
                if isinstance(change, AgentRemoved):
                    await kv.delete(key, last=last)
                    return
                revision = await kv.update(key, encode_agent(change, self.node_id), last=last)
            except nats.js.errors.KeyWrongLastSequenceError:
                try:
                    entry = await kv.get(key)
                except (nats.js.errors.KeyNotFoundError, nats.js.errors.KeyDeletedError):
                    return  # removed meanwhile: a change to it has nothing left to change
                # Not recorded as seen: the watch's entry for it is applied unless this
                # write lands on top of it.
                last = entry.revision or 0
                continue
            self._revisions[key] = max(revision, self._revisions.get(key, 0))
            return
        log.warning("CLUSTER_WRITE_CONFLICTED", agent_id=change.agent_id)

    # -- what other nodes changed ------------------------------------------------------------

    async def _watch(self, watcher: KeyValue.KeyWatcher) -> None:
        while True:
            try:
                entry = await _next(watcher, 3600)
            except nats.errors.TimeoutError:
                continue
            if entry is not None:
                try:
                    self._apply(entry)
                except Exception:
                    log.exception("CLUSTER_ENTRY_FAILED", key=entry.key)

    def _apply(self, entry: KeyValue.Entry) -> None:
        key = entry.key
        held = self._held.get(key)
        if held is not None:
            held.append(entry)
            return
        revision = entry.revision or 0
        if revision <= self._revisions.get(key, 0):
            return  # this node's own write, or older than what it already has
        self._revisions[key] = revision
        agent_id = agent_id_of(key)
        if entry.operation in DELETED:
            gone = self.router.registry.get(agent_id)
            actions = self.router.forgot(agent_id)
            if gone is not None and gone.home is not None:  # what waits for it is refused here
                self.relay.rehome(agent_id, gone.home, None)
        elif entry.value is None:
            return
        else:
            try:
                saved, home = decode_agent(agent_id, entry.value)
            except (ValueError, KeyError, TypeError):
                log.warning("CLUSTER_ENTRY_UNREADABLE", key=key)
                return
            known = self.router.registry.get(agent_id)
            old = known.home if known is not None else None
            actions = self.router.learned(saved, home)
            if old is not None and old != home:
                # It moved on: what was forwarded to its old home and not confirmed follows it.
                self.relay.rehome(agent_id, old, None if home == self.node_id else home)
            elif agent_id in self.handovers.released and home != self.node_id:
                # Handed over by this node, now taken there: what waited here for it goes on
                # (and what was forwarded it and its new home could not take yet, again).
                del self.handovers.released[agent_id]
                self.relay.rehome(agent_id, home, home)
                actions += self.router.looked_up(agent_id)
        self._execute(actions)


async def _next(watcher: KeyValue.KeyWatcher, timeout: float) -> KeyValue.Entry | None:
    """The watch's next entry; None marks the end of what the bucket held when it started."""
    entry: KeyValue.Entry | None = await watcher.updates(timeout)  # type: ignore[no-untyped-call]
    return entry


async def _quiet(error: Exception) -> None:
    """nats-py reports every failed (re)connect attempt here: at debug, not a traceback."""
    log.debug("NATS_ERROR", error=repr(error))


async def _until_led(js: nats.js.JetStreamContext, streams: list[str]) -> None:
    """Wait (`once_answered`) until each of `streams` that exists answers: after a NATS cluster
    restart each elects its leader from what it kept, which takes seconds, and until then
    every call on it times out."""
    for stream in streams:
        with contextlib.suppress(nats.js.errors.NotFoundError):
            await once_answered(functools.partial(js.stream_info, stream))


async def _shared_identity(js: nats.js.JetStreamContext, replicas: int) -> str:
    """The cluster's identity in KV `lobby`: this node's new one if it is the first to write."""

    async def bucket() -> KeyValue:
        try:
            return await js.key_value(LOBBY)
        except nats.js.errors.BucketNotFoundError:
            return await js.create_key_value(bucket=LOBBY, history=1, replicas=replicas)

    kv = await once_answered(bucket)  # its stream may have no leader yet, as `agents`'s

    async def claim() -> str:
        # A create that loses to another node's raises: both then read the winner's.
        with contextlib.suppress(nats.js.errors.KeyWrongLastSequenceError):
            await kv.create("identity", new_identity().encode())
        entry = await kv.get("identity")
        return (entry.value or b"").decode()

    return await once_answered(claim)
