"""The daemon's settings: one frozen dataclass, filled from flags or `LOBBY_*` variables."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from lobby.core.delivery import DEFAULT_DEDUPE_HORIZON, DEFAULT_DEDUPE_MAX
from lobby.core.limits import Limits
from lobby.core.router import DEFAULT_MAILBOX_LIMIT

LogFormat = Literal["json", "console"]
StoreKind = Literal["sqlite", "memory"]
TransportKind = Literal["websockets", "picows"]


@dataclass(frozen=True, kw_only=True, slots=True)
class Settings:
    host: str = "127.0.0.1"
    port: int = 8765
    """0 picks a free port; the one bound is logged as LOBBY_LISTENING."""
    data_dir: Path = Path(".lobby")
    """Where the sqlite store keeps its file."""
    store: StoreKind = "sqlite"
    transport: TransportKind = "websockets"
    """The WebSocket implementation: websockets (the default) or picows (the optional
    `agent-lobby[picows]` extra; C framing, faster)."""
    """sqlite (durable, the default) or memory (nothing survives the process)."""
    fsync: bool = False
    """Sync every commit to disk (survives power loss, costs throughput)."""
    max_message_bytes: int = 256 * 1024
    """A larger frame closes its connection with 1009."""
    max_outbound_bytes: int = 4 * 1024 * 1024
    """Bytes waiting to be written to one connection; past this it is closed with 4002."""
    mailbox_limit: int = DEFAULT_MAILBOX_LIMIT
    """Messages held for one offline agent; past this senders get `mailbox_full`."""
    dedupe_horizon: float = DEFAULT_DEDUPE_HORIZON
    """Seconds a sender's message_id is remembered, so a resend is delivered once."""
    dedupe_max: int = DEFAULT_DEDUPE_MAX
    """At most this many message ids are remembered (the oldest are forgotten first)."""
    commit_interval: float = 0.002
    """Seconds between the starts of two group commits: the longest a message waits before
    its commit starts (see the crash window in /healthz); longer means fewer, larger commits."""
    compact_interval: float = 10.0
    """Seconds between store checkpoints that forget acknowledged messages."""
    dialogue_timeout: float = 3600.0
    """Seconds a negotiation dialogue may idle before the lobby ends it (DIALOGUE_EXPIRED)."""
    message_rate: float = 10_000.0
    """Messages per second one agent may send (0: no limit); excess gets rate_limited."""
    message_burst: float = 20_000.0
    max_capabilities: int = 1_000
    max_open_requests: int = 10_000
    """REQUESTs one agent may have waiting for a final RESPONSE (0: no limit)."""
    max_open_dialogues: int = 10_000
    """Open negotiation dialogues one agent may have started (0: no limit)."""
    max_discover_bytes: int = 256 * 1024
    """Bytes of one DISCOVER_SERVICES answer; a longer one is split into pages (`next`)."""
    max_connections: int = 20_000
    """Connections at once; more are refused with HTTP 503 during the handshake."""
    handshake_timeout: float = 10.0
    """Seconds a new connection has to REGISTER before it is closed with 1008."""
    registration_rate: float = 20.0
    """REGISTER attempts per second from one source address (0: no limit)."""
    registration_burst: float = 100.0
    registration_key: str | None = None
    """When set, REGISTER payloads must carry it as `registration_key`."""
    tls_cert: Path | None = None
    """PEM certificate (chain): with `tls_key`, agents connect with wss://."""
    tls_key: Path | None = None
    ping_interval: float = 20.0
    ping_timeout: float = 20.0
    shutdown_timeout: float = 2.0
    log_format: LogFormat = "json"
    log_level: str = "info"

    def limits(self) -> Limits:
        return Limits(
            message_rate=self.message_rate,
            message_burst=self.message_burst,
            max_capabilities=self.max_capabilities,
            max_open_requests=self.max_open_requests,
            max_open_dialogues=self.max_open_dialogues,
            max_discover_bytes=self.max_discover_bytes,
            registration_rate=self.registration_rate,
            registration_burst=self.registration_burst,
            registration_key=self.registration_key,
        )
