"""Group commit: moves the router's journal into the store from one writer thread.

Commits start at most once per `interval` (2 ms): records pile up in the journal meanwhile and
go in together, and while one batch is being written the next one gathers. So under load a
batch holds many messages and the store's fixed cost per commit (a transaction, the last pages
rewritten in the WAL, a thread wake-up) is paid once for all of them; at low load a message
waits at most `interval` to be committed. Only after a batch is committed are its senders told
(ACCEPTED): "accepted" means durable. Delivery to receivers does not wait for the commit.

The committer builds no message: the core hands out each batch (`Router.take_journal()`) and
turns a finished commit into actions (`Router.committed()`), which `execute` carries out.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor

import structlog

from lobby.core.counters import SECONDS, SIZES, Buckets
from lobby.core.records import Batch, Compaction
from lobby.core.router import Router
from lobby.core.session import Action
from lobby.store.base import Store

log = structlog.get_logger("lobby.store")

Execute = Callable[[Iterable[Action]], None]
Mark = Callable[[], None]


class Committer:
    """Owns the writer thread and the commit timer: when a batch of the router's journal is
    written, and what is done once it is durable."""

    def __init__(
        self,
        store: Store,
        router: Router,
        execute: Execute,
        *,
        interval: float = 0.002,
        failed: Callable[[BaseException | None], bool] = lambda error: False,
    ) -> None:
        self.store = store
        self._failed = failed
        """Called with what a failed commit raised; True: the lobby steps down (a cluster node
        rejoins from its journal), so nothing more is committed and no later confirmation can
        cover what this commit lost."""
        self.halted = False
        """A commit failed and the lobby is stepping down: nothing more is written."""
        self.interval = interval
        """At most one commit starts per interval: rows gather into bigger batches, since a
        commit's fixed cost (rewriting the last pages in the WAL) dwarfs a row's."""
        self._timer: asyncio.TimerHandle | None = None
        self.router = router
        self._execute = execute
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="lobby-store")
        self._in_flight: asyncio.Future[None] | None = None
        self.batches = 0
        self.records = 0
        self.failed = False
        self.max_write_s = 0.0
        """The longest commit so far: with `interval`, the most a confirmed-to-be message
        waits before it is durable (the crash window; see stats())."""
        self._started = 0.0
        self.commit_seconds = Buckets(SECONDS)
        """Per commit, from its start to the store's answer (for /metrics)."""
        self.commit_records = Buckets(SIZES)
        """Per commit, the records it wrote (for /metrics)."""
        self.marks: list[Mark] = []
        """Cluster only: called once everything journaled before each was appended is durable
        (how a node learns which forwarded messages it may report committed); a failed commit
        drops them. Costs a single-node lobby one test per pass."""

    def kick(self) -> None:
        """Commit what the journal holds soon, unless a batch is already being written or
        due (then it goes into that one). Call after each handled frame; cheap when idle."""
        if self._in_flight is None and self._timer is None:
            if self.router.journal_pending:
                if not self.store.durable:
                    self._submit()
                else:
                    self._timer = asyncio.get_running_loop().call_later(self.interval, self._due)
            elif self.marks:
                self._run(self._take_marks())  # nothing waits to be written: all is durable

    def _due(self) -> None:
        self._timer = None
        if self._in_flight is None:
            self._submit()

    def after_durable(self, mark: Mark) -> None:
        """Run `mark` once everything journaled so far is committed (dropped if that fails)."""
        self.marks.append(mark)

    def _take_marks(self) -> list[Mark]:
        marks, self.marks = self.marks, []
        return marks

    @staticmethod
    def _run(marks: list[Mark]) -> None:
        for mark in marks:
            try:
                mark()
            except Exception:
                log.exception("COMMIT_MARK_FAILED")

    def _submit(self) -> None:
        batch = self.router.take_journal()
        marks = self._take_marks() if self.marks else []
        if self.halted:
            return  # stepping down: what was not committed is not confirmed either
        if not self.store.durable:
            self._execute(self.router.committed(batch))
            self._run(marks)
            return
        loop = asyncio.get_running_loop()
        self._started = loop.time()
        future = loop.run_in_executor(self._executor, self.store.write, batch.records)
        self._in_flight = future
        future.add_done_callback(lambda done: self._written(done, batch, marks))

    def _written(self, done: asyncio.Future[None], batch: Batch, marks: list[Mark]) -> None:
        if self._in_flight is done:
            self._in_flight = None
        if done.cancelled() or done.exception() is not None:
            # Nothing in this batch is confirmed; senders resend after reconnecting.
            self.failed = True
            error = None if done.cancelled() else done.exception()
            log.error("STORE_WRITE_FAILED", records=len(batch.records), error=repr(error))
            if not self.halted and self._failed(error):
                self.halted = True
        else:
            self.batches += 1
            self.records += len(batch.records)
            took = asyncio.get_running_loop().time() - self._started
            self.max_write_s = max(self.max_write_s, took)
            self.commit_seconds.observe(took)
            self.commit_records.observe(len(batch.records))
            self._execute(self.router.committed(batch))
            self._run(marks)
        if self._timer is None and self.marks and not self.router.journal_pending:
            self._run(self._take_marks())  # made while this batch was written, after it
        if self._timer is None and self.router.journal_pending:
            # Rows gathered while this batch was written: commit them one interval after this
            # batch started, or now if writing it took longer than that.
            wait = self._started + self.interval - asyncio.get_running_loop().time()
            if wait > 0:
                self._timer = asyncio.get_running_loop().call_later(wait, self._due)
            else:
                self._submit()

    def stats(self) -> dict[str, object]:
        """For /healthz: how much is written, and the crash window (a message accepted just
        after a commit started waits `interval` plus at most two commits to be durable)."""
        return {
            "durable": self.store.durable,
            "batches": self.batches,
            "records": self.records,
            "commit_interval_ms": self.interval * 1000,
            "max_commit_ms": round(self.max_write_s * 1000, 3),
            "crash_window_ms": round((self.interval + 2 * self.max_write_s) * 1000, 3),
        }

    async def flush(self) -> None:
        """Wait until everything journaled so far is committed (or its write failed)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        while True:
            in_flight = self._in_flight
            if in_flight is not None:
                with contextlib.suppress(Exception):  # logged by _written
                    await asyncio.shield(in_flight)
                # Awaiting a finished future does not yield: let its callback run first.
                await asyncio.sleep(0)
                continue
            if not self.router.journal_pending:
                return
            self._submit()

    async def compact(self, compaction: Compaction) -> None:
        await self.flush()
        if self.halted:
            return  # the store's state includes the failed commit: no snapshot of it
        await asyncio.get_running_loop().run_in_executor(
            self._executor, self.store.compact, compaction
        )

    async def close(self) -> None:
        await self.flush()
        await asyncio.get_running_loop().run_in_executor(self._executor, self.store.close)
        self._executor.shutdown(wait=True)
