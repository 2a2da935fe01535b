"""Persistence behind the lobby: the `Store` interface and its implementations."""

from __future__ import annotations

from typing import TYPE_CHECKING

from lobby.core.records import Compaction, Record, Snapshot
from lobby.store.base import Store, StoreUnavailable
from lobby.store.memory import MemoryStore
from lobby.store.sqlite import SqliteStore

if TYPE_CHECKING:
    from lobby.config import Settings


def open_store(settings: Settings) -> Store:
    """The store the settings ask for: sqlite in `data_dir` (default), memory, or JetStream
    with `cluster` (raises `StoreUnavailable` when NATS cannot be reached)."""
    if settings.cluster is not None:
        try:
            from lobby.store.jetstream import JetStreamStore  # nats-py: the cluster extra
        except ImportError:
            from lobby.config import install_hint

            raise StoreUnavailable(f"--cluster needs nats-py: {install_hint('cluster')}") from None
        assert settings.node_id is not None  # Settings.check
        return JetStreamStore(
            settings.cluster_urls(),
            settings.node_id,
            dedupe_max=settings.dedupe_max,
            replicas=settings.cluster_replicas,
            write_deadline=settings.cluster_write_deadline,
        )
    if settings.store == "memory":
        return MemoryStore()
    return SqliteStore(settings.data_dir, fsync=settings.fsync)


__all__ = [
    "Compaction",
    "MemoryStore",
    "Record",
    "Snapshot",
    "SqliteStore",
    "Store",
    "StoreUnavailable",
    "open_store",
]
