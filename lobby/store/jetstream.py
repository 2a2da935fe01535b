"""A lobby node's durable state on NATS JetStream (`lobby serve --cluster URL --node-id NAME`).

Journal: stream `LOBBY`, subject `journal.<node>`, one message per group commit (the records,
as `lobby.store.journal` encodes them), published with `Nats-Msg-Id` `<node>-<epoch>-<batch>`
(a publish retried after a lost reply is absorbed, not stored twice). A commit larger than NATS's
max_payload (1 MiB by default) goes out as several messages, one after another: a crash between
them keeps the first part, whose senders were not yet told ACCEPTED and resend (dedupe absorbs
the repeats).

Fencing: at start the store publishes to `epoch.<node>` (`{"at": ..., "by": <claimant>}`: the
node itself, or the node failing it over); that message's stream sequence is this process's
epoch. Every journal publish carries `Nats-Expected-Last-Subject-Sequence: <epoch>`
for subject `epoch.<node>`, so once a second process claims the same node id, every write of
the first is refused by the server. The first then fails each commit (the committer logs
STORE_WRITE_FAILED and confirms nothing more), says why on /readyz (503), and never compacts;
the committer reports the `StoreFenced` to the server, which steps down and rejoins
(`lobby.cluster.recovery`).

Snapshots: a JetStream Object Store (bucket `LOBBY_SNAPSHOTS`), one object `<node>.<seq>` per
compaction, `seq` being the last journal sequence it includes. An object store, because a
snapshot holds every agent and held message and easily outgrows NATS's max_payload (1 MiB),
which a KV value or a stream message cannot. Naming them by sequence means the newest wins even
if a fenced process raced a snapshot in; older ones are deleted after each compaction.
`load()` = the newest snapshot + the journal after it; `compact()` = write a snapshot of the
state kept as written (`journal.Folded`), then purge `journal.<node>` up to it.

Threads: nats-py is asyncio. The store has its own event loop, run in the committer's writer
thread for the length of each `write` and `compact` (`run_until_complete`): the NATS connection
is served there, and the lobby's event loop does none of the NATS work. Measured
(benchmarks/cluster_store.py), this costs about 150 us less CPU per commit than handing each
write to a loop running in a thread of its own. Between commits nothing reads the socket; an
idle node's compaction sends a PING instead of a snapshot, so NATS never sees a dead client
(`compact_interval` must stay under NATS's ping interval times its allowed missed pings,
2 minutes x 2 by default). One journal publish is in flight at a time (a fenced write must not
race another on the same subject, and the committer writes one batch at a time anyway);
`js.publish` (request/reply) is used, never `publish_async`, whose future never completes when
the server answers with an error.

Needs nats-server 2.11 or later (`Nats-Expected-Last-Subject-Sequence-Subject`); the
`cluster` extra installs 2.15.

Durability: the stream is created with one replica and the server's default sync (JetStream
fsyncs every 2 minutes): a commit survives the lobby process dying and the NATS process dying,
not the machine losing power. A 3-server NATS cluster and an R3 stream close that (docs/cluster.md).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Final, TypeVar

import nats
import nats.errors
import nats.js.errors
import orjson
import structlog
from nats.aio.client import Client
from nats.js import api

from lobby.core.records import DEFAULT_DEDUPE_MAX, Compaction, Record, Snapshot
from lobby.store.base import StoreFenced, StoreUnavailable
from lobby.store.journal import Folded, decode_records, encode_records

log = structlog.get_logger("lobby.store")

STREAM = "LOBBY"
SNAPSHOTS = "LOBBY_SNAPSHOTS"
_WRONG_LAST_SEQUENCE = 10071
"""JetStream's error code for a failed Nats-Expected-Last-* check: this node was fenced."""
_RETRYABLE = (
    nats.errors.TimeoutError,
    nats.errors.NoRespondersError,
    nats.js.errors.NoStreamResponseError,
    TimeoutError,
)
"""What a publish raises while NATS reconnects or a restarted server's JetStream starts."""


def transient(exc: nats.js.errors.APIError) -> bool:
    """Whether JetStream refused a publish for a while only (unavailable, electing a leader,
    an error without a code during a stall), not for good (a bad request, no such stream)."""
    if isinstance(exc, nats.js.errors.ServiceUnavailableError | nats.js.errors.ServerError):
        return True
    return not isinstance(exc, nats.js.errors.BadRequestError | nats.js.errors.NotFoundError) and (
        exc.err_code is None and exc.code is None
    )


START_PATIENCE: Final = 30.0
"""Seconds a node waits at start for a forming NATS cluster (at least; the write deadline if
longer): servers started together elect a JetStream leader within a few seconds, slower on a
loaded host."""

NOT_ENOUGH_PEERS: Final = 10005
"""JetStream's "no suitable peers for placement": a cluster with fewer servers up than the
stream's replicas (yet)."""


def _forming(exc: BaseException) -> bool:
    """Whether a set-up error is one of a NATS cluster still forming, worth waiting out."""
    if isinstance(exc, TimeoutError | nats.errors.TimeoutError):
        return True
    if isinstance(exc, nats.js.errors.ServiceUnavailableError) and exc.err_code is None:
        return False  # nobody answers the JetStream API: a server without -js
    if isinstance(exc, nats.js.errors.APIError):
        return transient(exc) or exc.err_code == NOT_ENOUGH_PEERS
    return False


T = TypeVar("T")


async def once_answered(call: Callable[[], Awaitable[T]]) -> T:
    """`call()`, again while a stream just made has no leader to answer it (a NATS cluster
    still forming: its servers started with this node), for up to `START_PATIENCE`."""
    deadline = asyncio.get_running_loop().time() + START_PATIENCE
    while True:
        try:
            return await call()
        except (nats.js.errors.NoStreamResponseError, nats.errors.TimeoutError, TimeoutError):
            if asyncio.get_running_loop().time() > deadline:
                raise
            await asyncio.sleep(0.25)


async def replicated(js: Any, stream: str, replicas: int) -> None:
    """Make `stream` (the journal, or a bucket's: `KV_<bucket>`, `OBJ_<bucket>`) keep
    `replicas` copies, as this node was started with (`--cluster-replicas`): the first node
    creates each with that many, and a node started later with another count changes them
    (JetStream copies the data to the new peers itself)."""
    config = (await js.stream_info(stream)).config
    if (config.num_replicas or 1) != replicas:
        config.num_replicas = replicas
        await js.update_stream(config)
        log.info("JETSTREAM_REPLICAS_CHANGED", stream=stream, replicas=replicas)


class JetStreamStore:
    """A `Store` on NATS JetStream for node `node_id`. Connecting, claiming the node's epoch
    and creating the stream happen in the constructor (raises `StoreUnavailable`)."""

    durable = True

    def __init__(
        self,
        servers: list[str],
        node_id: str,
        *,
        connect_timeout: float = 2.0,
        write_deadline: float = 10.0,
        dedupe_max: int = DEFAULT_DEDUPE_MAX,
        replicas: int = 1,
        claimant: str | None = None,
    ) -> None:
        self.node_id = node_id
        self.claimant = claimant or node_id
        """Who claims the node's epoch: the node itself, or a node failing it over (the claim
        says which, so the fenced process knows whether to rejoin: `lobby.cluster.recovery`)."""
        self.servers = servers
        self.write_deadline = write_deadline
        """Seconds a commit may keep retrying (NATS reconnecting, a leader election) before
        it fails."""
        self.dedupe_max = dedupe_max
        """Acknowledged messages a snapshot keeps at most (for dedupe after a restart)."""
        self.replicas = replicas
        """Copies NATS keeps of the journal stream and the snapshots (`replicated`)."""
        self._journal = f"journal.{node_id}"
        self._epoch_subject = f"epoch.{node_id}"
        self.epoch = 0
        self._batch = 0
        self._last_seq = 0
        """The stream sequence of the last journal message known written (or loaded)."""
        self._snapshot_seq = -1
        """The journal sequence the newest snapshot includes (-1: none written or read)."""
        self._fenced: str | None = None
        self._folded = Folded()
        self._closing = False
        self._loop = asyncio.new_event_loop()
        self._nc: Client | None = None
        try:
            self._call(self._open(connect_timeout), None)
        except BaseException:
            self.close()
            raise

    # -- the private event loop ----------------------------------------------------------------

    def _call(self, coroutine: Coroutine[Any, Any, T], timeout: float | None) -> T:
        """Run `coroutine` on the store's loop, in this thread (the writer thread). From a
        thread whose own loop is running (the lobby starting, a test), in a helper thread."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return self._loop.run_until_complete(asyncio.wait_for(coroutine, timeout))
        with concurrent.futures.ThreadPoolExecutor(1, "lobby-nats") as helper:
            return helper.submit(self._call, coroutine, timeout).result()

    async def _open(self, connect_timeout: float) -> None:
        where = ", ".join(self.servers)
        # nats-py retries a first connect forever unless attempts are bounded (0 is not a
        # bound there): probe first, each server at most twice, so an unreachable NATS is one
        # clear failure at start and the connection kept reconnects for ever.
        try:
            probe = await nats.connect(
                self.servers,
                connect_timeout=connect_timeout,
                allow_reconnect=False,
                max_reconnect_attempts=1,
                reconnect_time_wait=0.1,
                error_cb=_quiet,
            )
        except (OSError, nats.errors.Error) as exc:
            raise StoreUnavailable(f"cannot reach NATS at {where}: {_reason(exc)}") from None
        await probe.close()
        self._nc = await nats.connect(
            self.servers,
            name=f"lobby-{self.node_id}",
            connect_timeout=connect_timeout,
            max_reconnect_attempts=-1,
            reconnect_time_wait=0.5,
            # A stalled server (paused, overloaded) keeps its TCP connection open: while a
            # commit retries (the only time this connection's loop runs), unanswered pings
            # move it to another server well within the write deadline.
            ping_interval=1.0,
            max_outstanding_pings=3,
            error_cb=_quiet,
            disconnected_cb=self._disconnected,
            reconnected_cb=self._reconnected,
        )
        js = self._nc.jetstream()
        # A NATS cluster that is still forming (its servers started with the lobby) refuses
        # for a while: no JetStream leader yet, or not enough peers for the replicas. Wait for
        # it (`START_PATIENCE`) rather than fail the start.
        deadline = time.monotonic() + max(self.write_deadline, START_PATIENCE)
        waited = False
        while True:
            try:
                await self._set_up(js)
                return
            except (nats.errors.Error, TimeoutError) as exc:
                forming = _forming(exc)
                if forming and time.monotonic() < deadline:
                    if not waited:
                        log.warning("JETSTREAM_NOT_READY", node_id=self.node_id, error=_reason(exc))
                        waited = True
                    await asyncio.sleep(0.5)
                    continue
                if isinstance(exc, nats.js.errors.ServiceUnavailableError) and not forming:
                    raise StoreUnavailable(
                        f"NATS at {where} has no JetStream (start it with -js)"
                    ) from None
                raise StoreUnavailable(
                    f"cannot set up JetStream at {where}: {_reason(exc)}"
                ) from None

    async def _set_up(self, js: Any) -> None:
        """Create what is missing (the journal stream, the snapshots' bucket), give each the
        replicas asked for, and claim the node's epoch."""
        try:
            await js.stream_info(STREAM)
        except nats.js.errors.NotFoundError:
            await js.add_stream(
                name=STREAM,
                subjects=["journal.*", "epoch.*"],
                storage=api.StorageType.FILE,
                num_replicas=self.replicas,
            )
        try:
            await js.object_store(SNAPSHOTS)
        except nats.js.errors.BucketNotFoundError:
            await js.create_object_store(SNAPSHOTS, replicas=self.replicas)
        for stream in (STREAM, f"OBJ_{SNAPSHOTS}"):
            await replicated(js, stream, self.replicas)
        # Claim the node: from here on, a process still writing as this node is refused.
        claim = orjson.dumps({"at": time.time(), "by": self.claimant})
        claimed = await js.publish(self._epoch_subject, claim)
        self.epoch = claimed.seq
        await js.purge_stream(STREAM, subject=self._epoch_subject, keep=1)

    async def _disconnected(self) -> None:
        if not self._closing:
            log.warning("NATS_DISCONNECTED", node_id=self.node_id)

    async def _reconnected(self) -> None:
        log.info("NATS_RECONNECTED", node_id=self.node_id)

    @property
    def _js(self) -> Any:
        assert self._nc is not None
        return self._nc.jetstream()

    # -- Store ---------------------------------------------------------------------------------

    def load(self) -> Snapshot:
        """The newest snapshot plus the journal after it. Runs after this process claimed
        the node, so nothing an earlier process writes can land after what is read here."""

        async def read() -> Folded:
            # Again, from the start, while a stream just restarted has no leader to answer.
            self._last_seq, self._snapshot_seq = 0, -1
            return await self._load()

        self._folded = self._call(once_answered(read), None)
        return self._folded.snapshot()

    async def _load(self) -> Folded:
        js = self._js
        folded = Folded()
        snapshots = await self._snapshots()
        if snapshots:
            seq, name = max(snapshots)
            folded = Folded.decode((await (await js.object_store(SNAPSHOTS)).get(name)).data)
            self._last_seq = self._snapshot_seq = seq
        try:
            last = (await js.get_last_msg(STREAM, self._journal)).seq
        except nats.js.errors.NotFoundError:
            return folded
        if last <= self._last_seq:
            return folded
        config = api.ConsumerConfig(
            deliver_policy=api.DeliverPolicy.BY_START_SEQUENCE,
            opt_start_seq=self._last_seq + 1,
            ack_policy=api.AckPolicy.NONE,
            inactive_threshold=30.0,
            mem_storage=True,
        )
        reader = await js.pull_subscribe(self._journal, stream=STREAM, config=config)
        try:
            while self._last_seq < last:
                for msg in await reader.fetch(batch=256, timeout=5):
                    folded.apply(decode_records(msg.data))
                    self._last_seq = msg.metadata.sequence.stream
        finally:
            await reader.unsubscribe()
        return folded

    async def _snapshots(self) -> list[tuple[int, str]]:
        """(journal sequence, object name) of this node's snapshots."""
        store = await self._js.object_store(SNAPSHOTS)
        prefix = f"{self.node_id}."
        try:
            infos = await store.list(ignore_deletes=True)
        except nats.js.errors.NotFoundError:
            return []
        return [
            (int(info.name[len(prefix) :]), info.name)
            for info in infos
            if info.name.startswith(prefix) and info.name[len(prefix) :].isdigit()
        ]

    def write(self, records: list[Record]) -> None:
        if self._fenced is not None:
            raise StoreFenced(self._fenced)
        assert self._nc is not None
        messages = encode_records(records, self._nc.max_payload - 1024)
        # The core has applied these records whatever the outcome: so does the state a
        # snapshot is made of (replaying one that did reach the journal changes nothing).
        self._folded.apply(records)
        for message in messages:
            self._batch += 1
            self._call(self._publish(message, self._batch), self.write_deadline + 3)

    async def _publish(self, message: bytes, batch: int) -> None:
        headers = {
            "Nats-Msg-Id": f"{self.node_id}-{self.epoch}-{batch}",
            "Nats-Expected-Last-Subject-Sequence": str(self.epoch),
            "Nats-Expected-Last-Subject-Sequence-Subject": self._epoch_subject,
        }
        deadline = self._loop.time() + self.write_deadline
        while True:
            try:
                ack = await self._js.publish(
                    self._journal, message, timeout=2.0, headers=dict(headers)
                )
            except nats.js.errors.APIError as exc:
                if exc.err_code == _WRONG_LAST_SEQUENCE:
                    self._fenced = (
                        f"another process claimed node id {self.node_id!r} "
                        f"(this one's epoch {self.epoch} is over): it may not write any more"
                    )
                    raise StoreFenced(self._fenced) from None
                if not transient(exc) or self._loop.time() > deadline:
                    raise
                await asyncio.sleep(0.1)
                continue
            except _RETRYABLE:
                # NATS reconnecting or JetStream electing a leader: the same Nats-Msg-Id
                # makes a repeat of a publish that did land harmless.
                if self._loop.time() > deadline:
                    raise
                await asyncio.sleep(0.1)
                continue
            self._last_seq = max(self._last_seq, ack.seq)
            return

    def compact(self, compaction: Compaction) -> None:
        """Snapshot and purge, unless nothing was journaled since the last snapshot (an idle
        node does not rewrite its whole state every interval)."""
        if self._fenced is not None:
            return
        if self._last_seq == self._snapshot_seq:
            assert self._nc is not None
            self._call(self._nc.flush(5), 10.0)  # a PING: keeps the idle connection served
            return
        self._folded.compact(compaction, self.dedupe_max)
        data = self._folded.encode()
        self._call(self._compact(data), None)

    async def _compact(self, data: bytes) -> None:
        js = self._js
        # Still ours? A fenced process must not put a snapshot (it would be named by an older
        # sequence and so never read, but it costs space until the owner's next compaction).
        current = (await js.get_last_msg(STREAM, self._epoch_subject)).seq
        if current != self.epoch:
            return
        upto = max(self._last_seq, self.epoch)
        store = await js.object_store(SNAPSHOTS)
        name = f"{self.node_id}.{upto:020d}"
        await store.put(name, data)
        self._last_seq = self._snapshot_seq = upto
        await js.purge_stream(STREAM, subject=self._journal, seq=upto + 1)
        for _, older in await self._snapshots():
            if older != name:
                await store.delete(older)

    @property
    def last_seq(self) -> int:
        """The stream sequence of the last journal message written or loaded (a failover
        purges the dead node's journal up to it: `lobby.cluster.recovery`)."""
        return self._last_seq

    def unwritable(self) -> str | None:
        if self._fenced is not None:
            return self._fenced
        if self._nc is None or not self._nc.is_connected:
            return f"not connected to NATS at {', '.join(self.servers)} (reconnecting)"
        return None

    def close(self) -> None:
        if self._loop.is_closed():
            return
        self._closing = True
        if self._nc is not None and not self._nc.is_closed:
            with contextlib.suppress(TimeoutError, nats.errors.Error):
                self._call(self._nc.close(), 5.0)
        self._loop.close()


async def _quiet(error: Exception) -> None:
    """nats-py reports every failed (re)connect attempt here: at debug, not a traceback."""
    log.debug("NATS_ERROR", error=repr(error))


def _reason(exc: BaseException) -> str:
    if isinstance(exc, nats.errors.NoServersError):
        return "no server answered"
    return str(exc) or type(exc).__name__
