"""The daemon's settings: one frozen dataclass that says, per setting, its default, its help
text and what values it allows; `Settings.check()` holds every value to that before anything
is opened. `lobby.options` fills it from flags, `LOBBY_*` variables and a TOML file."""

from __future__ import annotations

import importlib.util
import os
import re
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Literal

from lobby.core.delivery import (
    DEFAULT_DEDUPE_HORIZON,
    DEFAULT_DELIVERY_WINDOW,
)
from lobby.core.limits import Limits
from lobby.core.records import DEFAULT_DEDUPE_MAX
from lobby.core.router import DEFAULT_MAILBOX_LIMIT
from lobby.core.tracing import Tracing
from lobby.extras import install_hint
from lobby.store import StoreSettings
from lobby.transport.base import TransportSettings

LogFormat = Literal["auto", "json", "console"]
LogLevel = Literal["debug", "info", "warning", "error"]
StoreKind = Literal["sqlite", "memory"]
TransportKind = Literal["websockets", "picows"]

_NODE_ID = re.compile(r"[-_a-zA-Z0-9]{1,64}")
"""A node id: a NATS subject token and a key in every bucket, as it is."""
_CLUSTER_URL = re.compile(r"(nats|tls)://[^\s/,]+")
MAX_REPLICAS = 5
"""Copies JetStream keeps of a stream at most."""


class SettingError(ValueError):
    """A setting's value is not allowed: `str()` is one line naming the setting, the value,
    what is wrong and what is allowed."""

    def __init__(self, name: str, problem: str) -> None:
        super().__init__(f"{name}: {problem}")
        self.name = name
        self.problem = problem


def _setting(
    default: Any, help: str, *, minimum: float | None = None, above: float | None = None
) -> Any:
    """A setting: `minimum` is the least allowed value, `above` a bound it must exceed."""
    return field(default=default, metadata={"help": help, "minimum": minimum, "above": above})


@dataclass(frozen=True, kw_only=True, slots=True)
class Settings:
    host: str = _setting("127.0.0.1", "address to listen on")
    port: int = _setting(8765, "port to listen on, 0-65535 (0: any free port)", minimum=0)
    data_dir: Path = _setting(Path(".lobby"), "directory for the lobby's data (the sqlite store)")
    store: StoreKind = _setting("sqlite", "sqlite (durable) or memory (nothing survives)")
    transport: TransportKind = _setting(
        "websockets", "websockets, or picows (the picows extra: make run EXTRAS=picows)"
    )
    cluster: str | None = _setting(
        None,
        "NATS servers (nats://HOST:PORT or tls://, comma-separated): run as a lobby node whose "
        "durable state lives in JetStream instead of the sqlite store (needs --node-id)",
    )
    node_id: str | None = _setting(
        None, "this node's name with --cluster: 1-64 letters, digits, '-' or '_', unique"
    )
    cluster_replicas: int = _setting(
        1,
        "copies NATS keeps of the lobby's streams and buckets with --cluster: 1, or 3 on a "
        "3-server NATS cluster (survives losing one server), at most 5",
        minimum=1,
    )
    cluster_dead_after: float = _setting(
        10.0,
        "seconds a node's heartbeat must have lapsed, while this node was itself connected to "
        "NATS, before it may be failed over (with --cluster; it must also not answer a ping, "
        "and NATS must have expired its key): longer rides out NATS blips, shorter fails a "
        "dead node's agents over sooner",
        above=3.0,  # NODE_TTL: by then NATS has expired a dead node's key
    )
    cluster_write_deadline: float = _setting(
        10.0,
        "seconds a commit keeps retrying while NATS does not take it (reconnecting, electing "
        "a leader) before it fails, with --cluster; a node whose commit failed steps down "
        "(its agents resume elsewhere) and rejoins from what it stored once NATS is back",
        above=0.0,
    )
    fsync: bool = _setting(False, "sync every commit to disk (survives power loss)")
    max_message_bytes: int = _setting(
        256 * 1024, "largest accepted frame; a larger one closes its connection with 1009", above=0
    )
    max_outbound_bytes: int = _setting(
        4 * 1024 * 1024,
        "bytes waiting for one receiver (its queue, and what arrived for it while it was "
        "connected and is held beyond the window) before it is closed with 4002",
        above=0,
    )
    delivery_window: int = _setting(
        DEFAULT_DELIVERY_WINDOW,
        "bytes written ahead of a receiver's reading: past them in its outbound queue, what is "
        "sent to it is held in its mailbox and written as the queue drains (at most half "
        "--max-outbound-bytes)",
        above=0,
    )
    mailbox_limit: int = _setting(
        DEFAULT_MAILBOX_LIMIT,
        "messages held for one agent before senders get mailbox_full",
        above=0,
    )
    dedupe_horizon: float = _setting(
        DEFAULT_DEDUPE_HORIZON, "seconds a sender's message_id is remembered for dedupe", above=0
    )
    dedupe_max: int = _setting(
        DEFAULT_DEDUPE_MAX, "most message ids remembered for dedupe (oldest forgotten)", above=0
    )
    commit_interval: float = _setting(
        0.002,
        "seconds between the starts of two group commits (the longest a message waits for its"
        " commit to start)",
        above=0,
    )
    compact_interval: float = _setting(
        10.0, "seconds between store checkpoints that forget acknowledged messages", above=0
    )
    dialogue_timeout: float = _setting(
        3600.0, "seconds a dialogue may idle before the lobby ends it (DIALOGUE_EXPIRED)", above=0
    )
    message_rate: float = _setting(
        10_000.0, "messages per second one agent may send (0: no limit)", minimum=0
    )
    message_burst: float = _setting(20_000.0, "messages one agent may send at once", above=0)
    max_capabilities: int = _setting(1_000, "capabilities one agent may declare", above=0)
    max_open_requests: int = _setting(
        10_000, "REQUESTs one agent may have waiting for a final RESPONSE (0: no limit)", minimum=0
    )
    max_open_dialogues: int = _setting(
        10_000, "open negotiation dialogues one agent may have started (0: no limit)", minimum=0
    )
    discover_rate: float = _setting(
        50.0, "DISCOVER_SERVICES queries per second one agent may send (0: no limit)", minimum=0
    )
    discover_burst: float = _setting(200.0, "DISCOVER_SERVICES one agent may send at once", above=0)
    max_discover_bytes: int = _setting(
        256 * 1024,
        "bytes of one DISCOVER_SERVICES answer (past it: fewer results and a next cursor)",
        above=0,
    )
    max_connections: int = _setting(
        20_000, "connections at once; more are refused with HTTP 503", above=0
    )
    handshake_timeout: float = _setting(
        10.0, "seconds a new connection has to REGISTER (then closed with 1008)", above=0
    )
    registration_rate: float = _setting(
        20.0, "REGISTER attempts per second per source address (0: no limit)", minimum=0
    )
    registration_burst: float = _setting(
        100.0, "REGISTER attempts at once per source address", above=0
    )
    registration_key: str | None = _setting(
        None, "a secret every REGISTER payload must carry as registration_key (default: none)"
    )
    admin_token: str | None = _setting(
        None,
        "the secret /admin wants (lobby revoke, lobby remove), 16 characters or more "
        "(default: the one kept in DATA_DIR/admin.token, mode 0600, made at the first start "
        "and kept across restarts, rotated by deleting that file before a start; a new one "
        "printed once on stderr at each start with --store memory)",
    )
    tls_cert: Path | None = _setting(
        None, "PEM certificate (chain) file: agents connect with wss:// (needs --tls-key)"
    )
    tls_key: Path | None = _setting(None, "PEM private key file for --tls-cert")
    ping_interval: float = _setting(20.0, "seconds between keepalive pings", above=0)
    ping_timeout: float = _setting(
        20.0, "seconds to wait for a pong before dropping the connection", above=0
    )
    shutdown_timeout: float = _setting(
        2.0, "seconds to close every connection on SIGINT/SIGTERM", above=0
    )
    discovery_worker: bool = _setting(
        True,
        "answer DISCOVER_SERVICES in a worker process holding a replica of the search index, "
        "off the event loop (false: in the lobby's own process)",
    )
    log_format: LogFormat = _setting(
        "auto",
        "json (one object a line), console (for people), or auto: console when stdout is a "
        "terminal, else json",
    )
    log_level: LogLevel = _setting("info", "debug, info, warning or error")
    trace_ids: bool = _setting(
        False,
        "start a W3C trace (traceparent) for every message sent without one; messages sent "
        "with one always keep it",
    )
    otel: bool = _setting(
        False,
        "emit an OpenTelemetry span per routed message through the global tracer provider "
        "(the otel extra: make run EXTRAS=otel; set up by opentelemetry-instrument, say); implies "
        "--trace-ids",
    )

    @property
    def close_timeout(self) -> float:
        """Seconds a closing connection has to finish the closing handshake before it is cut
        off (half the shutdown bound, so shutdown still ends in time)."""
        return self.shutdown_timeout / 2

    @property
    def outbound_window(self) -> int:
        """The delivery window in force: `delivery_window`, at most half of
        `max_outbound_bytes` (what is held for a connected receiver beyond it counts towards
        that bound, so a window as large would leave a slow reader no room)."""
        return min(self.delivery_window, self.max_outbound_bytes // 2)

    @property
    def outbound_low_water(self) -> int:
        """A paced connection is written to again once its queue falls to this (a quarter
        of the window, asyncio's own ratio): it keeps data to send while the lobby refills it."""
        return self.outbound_window // 4

    def for_store(self) -> StoreSettings:
        """What `lobby.store.open_store` reads of these settings."""
        return StoreSettings(
            store=self.store,
            data_dir=self.data_dir,
            fsync=self.fsync,
            cluster_urls=self.cluster_urls() if self.cluster is not None else None,
            node_id=self.node_id,
            dedupe_max=self.dedupe_max,
            cluster_replicas=self.cluster_replicas,
            cluster_write_deadline=self.cluster_write_deadline,
        )

    def for_transport(self) -> TransportSettings:
        """What a transport reads of these settings."""
        return TransportSettings(
            host=self.host,
            port=self.port,
            max_message_bytes=self.max_message_bytes,
            handshake_timeout=self.handshake_timeout,
            ping_interval=self.ping_interval,
            ping_timeout=self.ping_timeout,
            close_timeout=self.close_timeout,
            outbound_window=self.outbound_window,
            outbound_low_water=self.outbound_low_water,
            tls_cert=self.tls_cert,
            tls_key=self.tls_key,
        )

    def check(self) -> None:
        """Raise `SettingError` for the first value that is not allowed. Looks at files, never
        creates one."""
        for f in fields(self):
            value = getattr(self, f.name)
            minimum, above = f.metadata.get("minimum"), f.metadata.get("above")
            if minimum is not None and value < minimum:
                raise SettingError(f.name, f"must be at least {minimum:g}")
            if above is not None and value <= above:
                raise SettingError(f.name, f"must be above {above:g}")
        if self.port > 65535:
            raise SettingError("port", "not a port (0-65535)")
        if self.admin_token is not None and len(self.admin_token) < 16:
            raise SettingError("admin_token", "too short: 16 characters or more")
        if (self.tls_cert is None) != (self.tls_key is None):
            raise SettingError("tls_cert", "--tls-cert and --tls-key go together: give both")
        for name in ("tls_cert", "tls_key"):
            path: Path | None = getattr(self, name)
            if path is not None and not (path.is_file() and os.access(path, os.R_OK)):
                raise SettingError(name, "not a readable file")
        if self.otel and importlib.util.find_spec("opentelemetry.sdk") is None:
            raise SettingError("otel", f"needs OpenTelemetry: {install_hint('otel')}")
        self._check_cluster()
        if self.store == "sqlite" and self.cluster is None:
            _check_data_dir(self.data_dir)

    def _check_cluster(self) -> None:
        if self.cluster is None:
            if self.node_id is not None:
                raise SettingError("node_id", "only with --cluster (a node of a NATS cluster)")
            if self.cluster_replicas != 1:
                raise SettingError("cluster_replicas", "only with --cluster")
            return
        if self.cluster_replicas > MAX_REPLICAS:
            raise SettingError("cluster_replicas", f"at most {MAX_REPLICAS} (JetStream's limit)")
        for url in self.cluster.split(","):
            if not _CLUSTER_URL.fullmatch(url.strip()):
                raise SettingError(
                    "cluster", f"{url.strip()!r} is not a NATS URL (nats://HOST:PORT or tls://)"
                )
        if self.node_id is None:
            raise SettingError("cluster", "needs --node-id: this node's name in the cluster")
        if not _NODE_ID.fullmatch(self.node_id):
            raise SettingError("node_id", "expected 1-64 letters, digits, '-' or '_'")
        if self.store == "memory":
            raise SettingError("store", "memory and --cluster do not go together: drop one")

    def cluster_urls(self) -> list[str]:
        """The NATS servers `cluster` names."""
        return [url.strip() for url in (self.cluster or "").split(",")]

    def tracing(self) -> Tracing:
        """The lobby's part in W3C tracing that these settings ask for."""
        if self.otel:
            # Imported here: OpenTelemetry is an optional extra, checked by `check()`.
            from lobby.otel import OtelTracing

            return OtelTracing()
        return Tracing(start_traces=self.trace_ids)

    def limits(self) -> Limits:
        return Limits(
            message_rate=self.message_rate,
            message_burst=self.message_burst,
            max_capabilities=self.max_capabilities,
            max_open_requests=self.max_open_requests,
            max_open_dialogues=self.max_open_dialogues,
            max_discover_bytes=self.max_discover_bytes,
            discover_rate=self.discover_rate,
            discover_burst=self.discover_burst,
            registration_rate=self.registration_rate,
            registration_burst=self.registration_burst,
            registration_key=self.registration_key,
        )


def _check_data_dir(data_dir: Path) -> None:
    """The directory must be one the lobby can write, or one it can create."""
    if data_dir.exists():
        if not data_dir.is_dir():
            raise SettingError("data_dir", "exists and is not a directory")
        if not os.access(data_dir, os.W_OK | os.X_OK):
            raise SettingError("data_dir", "not writable by this user")
        return
    parent = data_dir.absolute().parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise SettingError("data_dir", f"cannot be created: {parent} is a file")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise SettingError("data_dir", f"cannot be created: {parent} is not writable by this user")
