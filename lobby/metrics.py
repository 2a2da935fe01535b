"""`GET /metrics`: the lobby's state and counts in the Prometheus text format.

Nothing here runs per message. The router and the committer count in plain ints
(`lobby.core.counters`); `LobbyCollector` reads them, and the state (agents, mailboxes,
conversations, dialogues, the ledger, the WAL), only when /metrics is scraped, into a
registry of its own (not prometheus_client's global one, which would also carry the process
metrics of whatever embeds the lobby).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Protocol

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector, CollectorRegistry

from lobby.core.counters import Buckets
from lobby.store.sqlite import SqliteStore

if TYPE_CHECKING:
    from lobby.committer import Committer
    from lobby.core.router import Router
    from lobby.store.base import Store


class Server(Protocol):
    """What the metrics read of the server (`lobby.server.LobbyServer`) at scrape time."""

    router: Router
    store: Store
    committer: Committer
    connections: int
    batch_seconds: Buckets

    def uptime(self) -> float: ...


CONTENT_TYPE = CONTENT_TYPE_LATEST


class LobbyCollector(Collector):
    """Reads one server at scrape time."""

    def __init__(self, server: Server) -> None:
        self.server = server
        self._ledger_seen = 0
        self._transactions: dict[str, int] = {}
        """Transactions by kind, counted up to `_ledger_seen` (the ledger only grows)."""

    def collect(self) -> Iterator[Metric]:
        server = self.server
        router = server.router
        agents = router.registry.agents
        yield _gauge("lobby_connections", "open WebSocket connections", server.connections)
        yield _gauge("lobby_agents_registered", "registered agents", len(agents))
        online = sum(1 for a in agents.values() if a.session is not None)
        yield _gauge("lobby_agents_online", "registered agents with a connection", online)
        mailboxes = [len(a.mailbox) for a in agents.values()]
        yield _gauge(
            "lobby_mailbox_messages",
            "messages held for agents (unacknowledged, or waiting for them to connect)",
            sum(mailboxes),
        )
        yield _gauge(
            "lobby_mailbox_largest_messages",
            "messages held for the agent that holds most",
            max(mailboxes, default=0),
        )
        yield _gauge(
            "lobby_conversations_open",
            "REQUEST conversations waiting for a final RESPONSE",
            len(router.requests.open),
        )
        yield _gauge(
            "lobby_dialogues_open", "negotiation dialogues not ended", len(router.negotiations.open)
        )
        yield _labelled(
            "lobby_messages_routed",
            "messages accepted for a receiver (delivered or held), by type; includes the "
            "lobby's notices, not its direct replies",
            "message_type",
            router.counters.by_type(),
        )
        yield _labelled(
            "lobby_refusals",
            "messages refused (an ERROR, or an error RESPONSE to a REQUEST), by code",
            "code",
            router.counters.refused,
        )
        yield _labelled(
            "lobby_transactions",
            "ledger transactions (negotiation: a confirmed deal; payment: a paid order)",
            "kind",
            self._count_transactions(),
        )
        yield _histogram(
            "lobby_routing_batch_seconds",
            "per read of a connection: from its first message reaching the lobby to what it "
            "routed being written to the receivers' sockets (the lobby's share of delivery "
            "latency)",
            server.batch_seconds,
        )
        committer = server.committer
        yield _histogram(
            "lobby_store_commit_seconds", "duration of a group commit", committer.commit_seconds
        )
        yield _histogram(
            "lobby_store_commit_records",
            "records written by a group commit",
            committer.commit_records,
        )
        store = server.store
        if isinstance(store, SqliteStore):
            wal = store.wal_bytes()
            yield _gauge("lobby_store_wal_bytes", "size of the SQLite write-ahead log", wal)
        yield _gauge("lobby_uptime_seconds", "seconds since the lobby started", server.uptime())

    def _count_transactions(self) -> dict[str, int]:
        ledger = self.server.router.ledger.transactions
        counts = self._transactions
        for tx in ledger[self._ledger_seen :]:
            kind = str(tx.get("kind", "unknown"))
            counts[kind] = counts.get(kind, 0) + 1
        self._ledger_seen = len(ledger)
        return counts


class Metrics:
    """The /metrics answer for one lobby."""

    def __init__(self, server: Server) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(LobbyCollector(server))

    def render(self) -> bytes:
        return generate_latest(self.registry)


def _gauge(name: str, documentation: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, documentation, value=value)


def _labelled(name: str, documentation: str, label: str, counts: dict[str, int]) -> Metric:
    family = CounterMetricFamily(name, documentation, labels=[label])
    for key, count in counts.items():
        family.add_metric([str(key)], count)
    return family


def _histogram(name: str, documentation: str, buckets: Buckets) -> Metric:
    return HistogramMetricFamily(
        name, documentation, buckets=buckets.cumulative(), sum_value=buckets.total
    )


__all__ = ["CONTENT_TYPE", "LobbyCollector", "Metrics"]
