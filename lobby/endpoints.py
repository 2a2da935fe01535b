"""HTTP on the lobby's port: `GET /healthz` (alive, with figures), `GET /readyz` (listening and
the store writable: 200, else 503 with the reason), `GET /metrics` (Prometheus,
`lobby.metrics`), `GET /dashboard` (its files, `lobby.dashboard`); `/admin`, the operators'
WebSocket (`lobby.admin_endpoint`), is let in here, and a full lobby or an unknown path is
refused before the WebSocket opens. Agents connect to `/`."""

from __future__ import annotations

from http import HTTPStatus
from typing import TYPE_CHECKING, Protocol

from lobby import admin_endpoint, dashboard
from lobby.metrics import CONTENT_TYPE
from lobby.transport.base import HttpAnswer
from protocol.models import LOBBY_ID

if TYPE_CHECKING:
    from lobby.admin_endpoint import AdminEndpoint
    from lobby.cluster.node import ClusterNode
    from lobby.committer import Committer
    from lobby.config import Settings
    from lobby.core.router import Router
    from lobby.metrics import Metrics
    from lobby.store import Store
    from lobby.transport.base import Transport


class Server(Protocol):
    """What the HTTP endpoints read of the server (`lobby.server.LobbyServer`)."""

    settings: Settings
    router: Router
    store: Store
    committer: Committer
    transport: Transport
    metrics: Metrics
    admin: AdminEndpoint | None
    cluster: ClusterNode | None
    identity: str
    connections: int
    fenced: str | None

    def listening(self) -> bool: ...
    def uptime(self) -> float: ...


class Endpoints:
    """Answers the HTTP requests on the lobby's port for one server."""

    def __init__(self, server: Server) -> None:
        self.server = server

    def admit(self, path: str, authorization: str | None = None) -> HttpAnswer | None:
        """The answer to an HTTP request for `path`, or None to accept the WebSocket."""
        server = self.server
        path, _, query = path.partition("?")
        if path == "/healthz":
            return HttpAnswer.json(HTTPStatus.OK, self.health())
        if path == "/readyz":
            return self.readiness()
        if path == "/metrics":
            return HttpAnswer(HTTPStatus.OK, server.metrics.render(), CONTENT_TYPE)
        if path == dashboard.PATH or path.startswith(dashboard.PATH + "/"):
            return dashboard.answer(path)
        limit = server.settings.max_connections
        full = server.connections >= limit
        # Even when full, operators with the token get in; a browser's connection, which
        # brings the token later, counts against the limit.
        browser = query == admin_endpoint.BROWSER_QUERY
        if path == admin_endpoint.PATH and server.admin is not None and not (browser and full):
            return server.admin.admit(authorization, query)
        if full:
            error = f"the lobby is full ({limit} connections)"
            return HttpAnswer.json(HTTPStatus.SERVICE_UNAVAILABLE, {"error": error})
        if path != "/":
            error = f"no such path {path!r}: agents connect to '/'"
            return HttpAnswer.json(HTTPStatus.NOT_FOUND, {"error": error})
        return None

    def readiness(self) -> HttpAnswer:
        """/readyz: 200 while listening with a writable store, else 503 and why."""
        server = self.server
        if server.fenced is not None:
            problem: str | None = f"fenced, serving nobody: {server.fenced}"
        elif not server.listening():
            problem = "not listening: the lobby is starting or stopping"
        else:
            problem = server.store.unwritable()
        if problem is None:
            return HttpAnswer.json(HTTPStatus.OK, {"status": "ready"})
        body = {"status": "not_ready", "reason": problem}
        return HttpAnswer.json(HTTPStatus.SERVICE_UNAVAILABLE, body)

    def health(self) -> dict[str, object]:
        """/healthz: the lobby's figures."""
        server = self.server
        agents = server.router.registry.agents
        return {
            "status": "ok",
            "lobby_id": LOBBY_ID,
            "lobby_identity": server.identity,
            "agents": len(agents),
            "agents_online": sum(1 for a in agents.values() if a.session is not None),
            "connections": server.connections,
            "uptime_s": round(server.uptime(), 3),
            "transport": server.transport.name,
            "store": server.committer.stats(),
        } | self._cluster_health()

    def _cluster_health(self) -> dict[str, object]:
        cluster = self.server.cluster
        if cluster is None:
            return {}
        return {
            "node_id": cluster.node_id,
            "nodes": cluster.liveness.alive(),
            "recovered": cluster.recovery.recovered,
            "unconfirmed_forwards": sum(len(link.kept) for link in cluster.relay.links.values()),
        }
