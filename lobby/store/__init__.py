"""Persistence behind the lobby: the `Store` interface and its implementations."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from lobby.core.records import DEFAULT_DEDUPE_MAX, Compaction, Record, Snapshot
from lobby.store.base import Store, StoreUnavailable
from lobby.store.memory import MemoryStore
from lobby.store.sqlite import SqliteStore


@dataclass(frozen=True, slots=True)
class StoreSettings:
    """Which store to open, and how: the lobby's settings (`lobby.config.Settings`, which
    names each) as the stores take them."""

    store: Literal["sqlite", "memory"] = "sqlite"
    data_dir: Path = Path(".lobby")
    fsync: bool = False
    cluster_urls: list[str] | None = None
    """The NATS servers of a cluster (`--cluster`): a JetStream store, whatever `store` says."""
    node_id: str | None = None
    dedupe_max: int = DEFAULT_DEDUPE_MAX
    cluster_replicas: int = 1
    cluster_write_deadline: float = 10.0


def open_store(settings: StoreSettings) -> Store:
    """The store the settings ask for: sqlite in `data_dir` (default), memory, or JetStream
    with `cluster_urls` (raises `StoreUnavailable` when NATS cannot be reached)."""
    if settings.cluster_urls is not None:
        try:
            from lobby.store.jetstream import JetStreamStore  # nats-py: the cluster extra
        except ImportError:
            from lobby.extras import install_hint

            raise StoreUnavailable(f"--cluster needs nats-py: {install_hint('cluster')}") from None
        assert settings.node_id is not None  # Settings.check
        return JetStreamStore(
            settings.cluster_urls,
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
    "StoreSettings",
    "StoreUnavailable",
    "open_store",
]
