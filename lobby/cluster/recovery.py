"""Failover of a dead node: one survivor adopts its agents from its journal; and the other
side of it, a node that finds itself fenced.

Judging (`lobby.cluster.verdicts`): once a second, each node takes the nodes silent for
`dead_after` (10 s) while it was itself sound, and fails one over only on evidence besides:
NATS no longer holds its key in `nodes` (it expires `NODE_TTL`, 3 s, after the last heartbeat;
a node stopped cleanly deletes it and is not failed over: its agents wait for its restart) and
it does not answer `lobby.ping.<node>` (`Relay.probe`). Then the survivors race
`kv.create(<node>)` in the bucket `recoveries`: exactly one wins. The winner
1. claims the dead node's journal epoch (`JetStreamStore`, as a restart of it would), so a
   zombie of it that comes back can no longer write;
2. loads its snapshot plus the journal after it and adopts, into its own core, the agents
   whose home that node still was (`lobby.core.cluster.adoption`): mailboxes, seq marks, dedupe ids,
   open conversations, journaled here; their keys in `agents` name the winner, so every node
   forwards to it from then on and resends what the dead node never confirmed
   (`lobby.cluster.routing`);
3. once that is committed, purges the dead node's journal and snapshots, and marks its key in
   `recoveries` done: a process started later with its node id starts empty.
Meanwhile resumes of the dead node's agents wait on every node (`SharedRegistry.held`), and
go ahead once their state is in one place (checked on the router's tick, `Router.failovers`),
or are closed with 1013 after `FAILOVER_HOLD`. A failed attempt
(NATS away) deletes the key, and the next check tries again while the node stays dead.

Fenced: a node that was judged dead wrongly (paused, cut off) must not go on serving what
another node now owns. Each node watches its own key in `recoveries` (a put there: someone
started recovering it) and, once a second, compares the last claim on `epoch.<node>` with its
store's epoch; the committer reports a commit refused as fenced. Any of these calls `fenced`
once: the server steps down and, if the last claim of its epoch names another node (a
failover; a second process started with its node id names itself, and the first then stays
down rather than fence it in turn), `lobby serve` starts it again under a new epoch
(`lobby.cli`). Before a node claims its epoch, at every start, it waits (up to
`REJOIN_WAIT`) while its key in `recoveries` says a recovery is in progress
(`wait_for_recovery`): it then loads what is left of its journal, nothing if the recovery
completed, everything if it failed before its purge.

Test hook: with `LOBBY_TEST_RECOVERY_FAILS=1` in its environment, a node's every failover
attempt fails right after claiming the dead node's epoch (a failover that fails half-way).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Final

import nats
import nats.errors
import nats.js.errors
import orjson
import structlog
from nats.js import JetStreamContext
from nats.js.kv import KeyValue

from lobby.cluster.liveness import HEARTBEAT, NODES, Liveness
from lobby.core.cluster.adoption import adopt
from lobby.core.records import Snapshot
from lobby.core.router import Router
from lobby.core.session import Action
from lobby.store.jetstream import SNAPSHOTS, STREAM, JetStreamStore

log = structlog.get_logger("lobby.cluster")

RECOVERIES: Final = "recoveries"
"""The KV bucket whose key `<node>` names the node that adopted `<node>`'s agents (`done`
once it has)."""
REJOIN_WAIT: Final = 30.0
"""Seconds a starting node waits at most for a recovery of it in progress to finish (a
recoverer that died half-way leaves its key behind)."""
_FAILED = (nats.errors.Error, TimeoutError, OSError)
_DELETED = ("DEL", "PURGE")


class Recovery:
    """Watches for dead nodes and fails them over; `await start(js)`, `await stop()`.
    `rehome(agent_id, old, new)` is called for each adopted agent (the relay's resends);
    `flush()` waits until this node's journal is committed; `probe(node)` says whether a node
    answers its ping; `fenced(reason)` is called once if this node (claimed at `epoch`) is
    found fenced."""

    def __init__(
        self,
        node_id: str,
        servers: list[str],
        router: Router,
        liveness: Liveness,
        execute: Callable[[Iterable[Action]], None],
        rehome: Callable[[str, str, str | None], None],
        flush: Callable[[], Awaitable[None]],
        *,
        probe: Callable[[str], Awaitable[bool]],
        fenced: Callable[[str], None],
        epoch: int = 0,
        reclaim: Callable[[str, list[str]], None] = lambda dead, adopted: None,
    ) -> None:
        self.node_id = node_id
        self.servers = servers
        self.router = router
        self.liveness = liveness
        self._execute = execute
        self._rehome = rehome
        self._flush = flush
        self._reclaim = reclaim
        self._probe = probe
        self._fenced = fenced
        self.epoch = epoch
        """The epoch this node's store claimed (0: unknown, not checked)."""
        self.fenced: str | None = None
        self.recovered: dict[str, int] = {}
        """Node -> how many of its agents this node adopted."""
        self._settled: set[str] = set()
        """Dead nodes this node recovered or saw another recover (until heard from again)."""
        self._held_at: dict[str, float] = {}
        """Node held down (`SharedRegistry.held`) -> when (monotonic) this loop first saw it so."""
        self._js: JetStreamContext | None = None
        self._kv: KeyValue | None = None
        self._nodes: KeyValue | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._replicas = 1

    async def start(self, js: JetStreamContext, replicas: int = 1) -> None:
        self._js, self._replicas = js, replicas
        try:
            self._kv = await js.key_value(RECOVERIES)
        except nats.js.errors.BucketNotFoundError:
            self._kv = await js.create_key_value(bucket=RECOVERIES, history=1, replicas=replicas)
        self._nodes = await js.key_value(NODES)
        with contextlib.suppress(nats.js.errors.KeyNotFoundError):
            await self._kv.delete(self.node_id)  # this node is back: it may fail over again
        mine = await self._kv.watch(self.node_id)
        self._tasks = [
            asyncio.create_task(self._watch()),
            asyncio.create_task(self._watch_mine(mine)),
        ]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def _fence(self, reason: str) -> None:
        if self.fenced is None:
            self.fenced = reason
            self._fenced(reason)

    async def _watch_mine(self, watcher: KeyValue.KeyWatcher) -> None:
        """A put of this node's own key in `recoveries`: another node started recovering it."""
        while True:
            try:
                entry = await watcher.updates(3600)  # type: ignore[no-untyped-call]
            except nats.errors.TimeoutError:
                continue
            if entry is None or entry.operation in _DELETED or entry.value is None:
                continue
            by = orjson.loads(entry.value).get("by", "?")
            self._fence(f"node {by!r} started recovering this node {self.node_id!r}")
            return

    async def _epoch_claimed(self) -> bool:
        """Whether another process claimed this node's epoch since its store did."""
        if not self.epoch or self._js is None:
            return False
        try:
            last = await self._js.get_last_msg(STREAM, f"epoch.{self.node_id}")
        except (*_FAILED, nats.js.errors.NotFoundError):
            return False  # NATS away: checked again next time
        if last.seq == self.epoch:
            return False
        self._fence(
            f"another process claimed node id {self.node_id!r} (this one's epoch "
            f"{self.epoch} is over)"
        )
        return True

    async def claimant(self) -> str | None:
        """Who made the last claim of this node's epoch: another node (a failover: this node
        rejoins) or this node id (a second process started with it: this one stays down, or
        the two would fence each other in turn); None if NATS does not say."""
        if self._js is None:
            return None
        try:
            last = await self._js.get_last_msg(STREAM, f"epoch.{self.node_id}")
        except (*_FAILED, nats.js.errors.NotFoundError):
            return None
        try:
            return str(orjson.loads(last.data or b"")["by"])
        except (orjson.JSONDecodeError, KeyError, TypeError):
            return self.node_id  # a claim from before claims named their maker: a restart

    async def _watch(self) -> None:
        shared = self.router.state.shared
        assert shared is not None
        while True:
            await asyncio.sleep(HEARTBEAT)
            if self.fenced is not None or await self._epoch_claimed():
                return  # stepping down: judging others is for the next incarnation
            suspects = self.liveness.suspects()
            # A node heard again (restarted) is no longer held, nor settled: heard after it was
            # first seen held, not merely within the heartbeats' TTL (a node killed a moment
            # ago is, and its held resumes would be probed afresh each second).
            now = time.monotonic()
            held_at = self._held_at
            for node_id in [n for n in held_at if n not in shared.held]:
                del held_at[node_id]
            for node_id in list(shared.held):
                if self.liveness.heard.get(node_id, 0.0) > held_at.setdefault(node_id, now):
                    shared.held.discard(node_id)
                    del held_at[node_id]
            self._settled &= set(suspects)
            for node_id in suspects:
                if node_id not in self._settled and not await self._dead(node_id):
                    continue
                shared.held.add(node_id)
                if node_id not in self._settled:
                    try:
                        await self._recover(node_id)
                    except _FAILED as exc:
                        log.warning("CLUSTER_RECOVERY_FAILED", node_id=node_id, error=repr(exc))
                    except Exception:  # its journal unreadable, say: logged, tried again
                        log.exception("CLUSTER_RECOVERY_FAILED", node_id=node_id)

    async def _dead(self, suspect: str) -> bool:
        """The evidence beyond a lapsed heartbeat: NATS has no key for `suspect` in `nodes`
        and it does not answer its ping. Either sign of life counts as a heartbeat."""
        assert self._nodes is not None
        try:
            await self._nodes.get(suspect)
        except (nats.js.errors.KeyNotFoundError, nats.js.errors.KeyDeletedError):
            pass
        except _FAILED:
            return False  # NATS away: no evidence either way
        else:
            self.liveness.verdicts.heard_from(suspect, time.monotonic())
            return False
        if await self._probe(suspect):
            self.liveness.verdicts.heard_from(suspect, time.monotonic())
            return False
        return True

    async def _recover(self, dead: str) -> None:
        assert self._kv is not None
        claim = orjson.dumps({"by": self.node_id, "at": time.time()})
        try:
            await self._kv.create(dead, claim)
        except nats.js.errors.KeyWrongLastSequenceError:
            self._settled.add(dead)  # another node won: its writes to `agents` re-home them
            return
        log.info("CLUSTER_RECOVERY_STARTED", node_id=dead)
        try:
            snapshot, upto = await asyncio.to_thread(
                _load, self.servers, dead, self._replicas, self.node_id
            )
        except BaseException:
            with contextlib.suppress(*_FAILED):
                await self._kv.delete(dead)  # the next check tries again
            raise
        adopted = adopt(self.router, snapshot, dead)
        for agent_id in adopted:
            self._rehome(agent_id, dead, None)
        # Agents this node handed to the dead node, which died before its adoption of them
        # was committed (not in its journal): this node's again (the handover's two phases).
        self._reclaim(dead, adopted)
        self._execute([])  # the server's pass: the adoption's records and writes go out
        await self._flush()
        await self._purge(dead, upto)
        done = orjson.dumps({"by": self.node_id, "at": time.time(), "done": True})
        try:
            await self._kv.put(dead, done)
        except _FAILED as exc:  # its restart waits REJOIN_WAIT, then goes ahead
            log.warning("CLUSTER_RECOVERY_UNMARKED", node_id=dead, error=repr(exc))
        self.recovered[dead] = len(adopted)
        self._settled.add(dead)
        agents = self.router.registry.agents
        held = sum(len(agents[a].mailbox) for a in adopted if a in agents)
        log.info("CLUSTER_NODE_RECOVERED", node_id=dead, agents=len(adopted), held_messages=held)

    async def _purge(self, dead: str, upto: int) -> None:
        """The dead node's journal and snapshots up to stream sequence `upto` are this node's
        now: drop them (not what a process restarted with its node id wrote since)."""
        assert self._js is not None
        js = self._js
        await js.purge_stream(STREAM, subject=f"journal.{dead}", seq=upto + 1)
        store = await js.object_store(SNAPSHOTS)
        prefix = f"{dead}."
        with contextlib.suppress(nats.js.errors.NotFoundError):
            for info in await store.list(ignore_deletes=True):
                seq = info.name[len(prefix) :]
                if info.name.startswith(prefix) and seq.isdigit() and int(seq) <= upto:
                    await store.delete(info.name)


def _load(servers: list[str], dead: str, replicas: int, claimant: str) -> tuple[Snapshot, int]:
    """Fence node `dead` (claim its epoch) and read its state, with the last stream sequence
    read; in a thread of its own (the store runs its own event loop)."""
    store = JetStreamStore(servers, dead, replicas=replicas, claimant=claimant)
    try:
        if os.environ.get("LOBBY_TEST_RECOVERY_FAILS") == "1":
            raise nats.errors.Error("test hook LOBBY_TEST_RECOVERY_FAILS: load failed")
        return store.load(), max(store.last_seq, store.epoch)
    finally:
        store.close()


async def wait_for_recovery(servers: list[str], node_id: str, bound: float = REJOIN_WAIT) -> None:
    """Before node `node_id` claims its epoch: wait, up to `bound` seconds, while another node's
    recovery of it is in progress (its key in `recoveries` there and not done). Returns at once
    if NATS cannot be reached (the store's start then says so)."""
    try:
        nc = await nats.connect(  # bounded as `JetStreamStore`'s probe: at most twice each
            servers,
            connect_timeout=2.0,
            allow_reconnect=False,
            max_reconnect_attempts=1,
            reconnect_time_wait=0.1,
            error_cb=_quiet,
        )
    except (OSError, nats.errors.Error):
        return
    try:
        kv = await nc.jetstream().key_value(RECOVERIES)
        deadline = time.monotonic() + bound
        waiting = False
        while time.monotonic() < deadline:
            try:
                entry = await kv.get(node_id)
            except (nats.js.errors.KeyNotFoundError, nats.js.errors.KeyDeletedError):
                return
            if entry.value is None or orjson.loads(entry.value).get("done"):
                return
            if not waiting:
                waiting = True
                by = orjson.loads(entry.value).get("by")
                log.info("CLUSTER_REJOIN_WAITING", node_id=node_id, recovering_node=by)
            await asyncio.sleep(0.2)
        log.warning("CLUSTER_REJOIN_WAIT_EXPIRED", node_id=node_id, waited_s=bound)
    except (*_FAILED, nats.js.errors.BucketNotFoundError):
        return
    finally:
        await nc.close()


async def _quiet(error: Exception) -> None:
    log.debug("NATS_ERROR", error=repr(error))
