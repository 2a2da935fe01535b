"""`AgentCore`: what every agent runs on: its lifecycle, its connection and the read loop.

`agent.Agent` adds calls, capability serving, negotiation and the marketplace on top; each of
those layers adds the routes of the message types it handles to one table, `_routes`, in its
`__init__`. What the core composes:

    dispatch.Dispatcher   what each frame received means (pure: decode, dedupe, answers, ACKs)
    reading.Reader        carries that out: answers to calls, messages to routes as tasks
    policy.Policy         hooks on every message in and out (`agent.policy`)
    calls.Outstanding     the futures of waiting calls and questions to the lobby
    tasks.Handlers        the tasks routes run in, bounded and tracked
    sending.Sender        the way out: sends, resends after a reconnect, ACKs

The read loop never blocks: RESPONSEs and lobby replies complete waiting calls at once; any
other message runs its route (or `on_message`) as a task, at most `max_concurrency` at a time
with at most `backlog` more waiting. Past that, a REQUEST is answered with status `error`, code
`rate_limited`, and other messages are dropped and counted in `stats.overflow_dropped`.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import signal
import ssl
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self

from agent_sdk.calls import Outstanding
from agent_sdk.capability import CapabilitySpec, collect_capabilities
from agent_sdk.connection import Link, Registration, lobby_urls, registered_links
from agent_sdk.dispatch import (
    Dispatcher,
)
from agent_sdk.errors import AgentSDKError, NotConnectedError, RegistrationError, ReplacedError
from agent_sdk.identity import DEFAULT_TOKEN_STORE, Identity, TokenStore
from agent_sdk.logs import log, set_level
from agent_sdk.policy import Policy
from agent_sdk.reading import Reader, Route
from agent_sdk.sending import Sender
from agent_sdk.stats import AgentStats, Status
from agent_sdk.tasks import Handlers
from agent_sdk.tracing import Tracing
from protocol.models import LOBBY_ID, CloseCode, Message, MessageType, close_code_name
from protocol.payloads import Capability

if TYPE_CHECKING:
    from opentelemetry.trace import TracerProvider

DEFAULT_LOBBY_URL = "ws://127.0.0.1:8765/"


class AgentCore:
    """Subclass, set `agent_id` (or pass it), declare capabilities, run. Owns the agent's
    lifecycle (`run()`, `stop()`), its connection (register, resume, reconnect), its
    capabilities and the route table.

    Options are keyword-only: `lobby_url` (default: `$LOBBY_URL`, else ws://127.0.0.1:8765/;
    several, as a list or comma-separated, for the nodes of a cluster: a reconnect moves on to
    the next after a failed attempt; the token is kept under the identity the lobby announces,
    else under the first),
    `max_concurrency` handlers at once, `backlog` more waiting, `request_timeout` default for
    calls, `reconnect` (False: `run()` returns when the connection drops), `reconnect_max_delay`
    cap of the backoff, `dedupe_window` message ids remembered to drop redeliveries,
    `max_unconfirmed` messages sent but not yet confirmed by the lobby (sending waits past it),
    `ssl_context` to trust a wss:// lobby's certificate (default: the system's), `token` to
    resume with and `token_store` to keep it across restarts (`agent_sdk.identity`),
    `stop_timeout` seconds a clean stop waits for the lobby to confirm what was sent,
    `log_level` to show the SDK's own log from that level (`agent_sdk.logs`; default: as the
    application configured `logging`, which prints nothing but warnings, to stderr),
    `otel` True (the global tracer provider) or a `TracerProvider` to handle each message in an
    OpenTelemetry span (the `otel` extra: `make run EXTRAS=otel`; `agent_sdk.otel`). Either way,
    what a handler sends carries the trace of the message it handles (`agent_sdk.tracing`).
    """

    agent_id: str = ""

    def __init__(
        self,
        agent_id: str | None = None,
        *,
        lobby_url: str | Sequence[str] | None = None,
        max_concurrency: int = 64,
        backlog: int = 1024,
        request_timeout: float = 30.0,
        reconnect: bool = True,
        reconnect_max_delay: float = 10.0,
        connect_timeout: float = 30.0,
        dedupe_window: int = 10_000,
        max_unconfirmed: int = 1000,
        ssl_context: ssl.SSLContext | None = None,
        token: str | None = None,
        token_store: TokenStore | None = DEFAULT_TOKEN_STORE,
        stop_timeout: float = 2.0,
        log_level: int | str | None = None,
        otel: bool | TracerProvider = False,
    ) -> None:
        self.agent_id = agent_id or type(self).agent_id
        if not self.agent_id:
            raise ValueError("an agent needs an agent_id (class attribute or argument)")
        self.lobby_urls = lobby_urls(lobby_url or os.environ.get("LOBBY_URL") or DEFAULT_LOBBY_URL)
        """Where the lobby listens: one address, or the nodes of a cluster."""
        self.lobby_url = self.lobby_urls[0]
        """The first of `lobby_urls`: the token store keeps the agent's token under it for a
        lobby that announces no identity."""
        self.request_timeout = request_timeout
        self.reconnect = reconnect
        self.reconnect_max_delay = reconnect_max_delay
        self.connect_timeout = connect_timeout
        self.ssl_context = ssl_context
        self.stop_timeout = stop_timeout
        if log_level is not None:
            set_level(log_level)
        self._identity = Identity(self.agent_id, self.lobby_url, token, token_store)
        self.status = Status.IDLE
        self.stats = AgentStats()
        self.capabilities: dict[str, CapabilitySpec] = collect_capabilities(type(self))
        self._routes: dict[MessageType, Route] = {}
        """What runs each message type delivered to the application; each layer adds its
        own in `__init__`. A type with no route goes to `on_message`."""
        self._after_connect: list[Callable[[], None]] = []
        """What each layer does once registered on a connection, before reading (send its
        watches again, `presence.Watcher`); each adds its own in `__init__`."""
        self._outstanding = Outstanding()
        self._dispatcher = Dispatcher(
            self.stats,
            calls=self._outstanding.calls,
            questions=self._outstanding.questions,
            dedupe_window=dedupe_window,
            max_unconfirmed=max_unconfirmed,
        )
        self._handlers = Handlers(
            self.agent_id, self.stats, max_concurrency=max_concurrency, backlog=backlog
        )
        self._stopping = asyncio.Event()
        self._id_prefix = uuid.uuid4().hex[:16]
        self._ids = itertools.count(1)
        tracing = Tracing()
        if otel is not False:
            # Imported here: OpenTelemetry is an optional extra.
            from agent_sdk.otel import OtelTracing

            tracing = OtelTracing(self.agent_id, None if otel is True else otel)
        self._tracing = tracing
        self.policy = Policy(self.agent_id)
        """Hooks on every message in and out (`agent_sdk.policy`)."""
        self._sender = Sender(
            self.agent_id,
            self._dispatcher,
            self._handlers,
            self._stopping,
            policy=self.policy,
            new_id=self.new_id,
            lobby_url=self.lobby_url,
            request_timeout=request_timeout,
            tracing=tracing,
        )
        self._reader = Reader(
            self.agent_id,
            dispatcher=self._dispatcher,
            outstanding=self._outstanding,
            sender=self._sender,
            handlers=self._handlers,
            routes=self._routes,
            fallback=self.on_message,
            policy=self.policy,
            tracing=tracing,
        )
        self._runner: asyncio.Task[None] | None = None

    # -- hooks (override) -----------------------------------------------------------------

    async def on_start(self) -> None:
        """Once, before the first connection."""

    async def on_stop(self) -> None:
        """Once, after the last connection closed."""

    async def on_connected(self) -> None:
        """After each successful REGISTER (the first one and every reconnect)."""

    async def on_disconnected(self) -> None:
        """After each lost connection."""

    async def on_message(self, message: Message) -> None:
        """Every message no other callback took (unknown RESPONSEs, ERRORs, other types)."""

    # -- running --------------------------------------------------------------------------

    async def run(self) -> None:
        """Connect, register and serve until `stop()` (or, without `reconnect`, a drop).

        Raises `RegistrationError` if the lobby refuses this agent.
        """
        current = asyncio.current_task()
        if self._runner is not None and self._runner is not current:
            raise RuntimeError(f"agent {self.agent_id!r} is already running")
        self._runner = current
        self._stopping.clear()
        self._sender.open = True
        await self._hook(self.on_start)
        serve = asyncio.create_task(self._serve())
        stop = asyncio.create_task(self._stopping.wait())
        try:
            await asyncio.wait({serve, stop}, return_when=asyncio.FIRST_COMPLETED)
            if not serve.done():
                await self._settle_before_stop()
        finally:
            stop.cancel()
            serve.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await serve
            await self._shutdown()
            await self._hook(self.on_stop)
            self._runner = None
        if not serve.cancelled():
            serve.result()  # re-raise what ended it (e.g. RegistrationError)

    async def stop(self) -> None:
        """Stop serving: wait up to `stop_timeout` for the lobby to confirm what was sent,
        acknowledge what was processed, close the connection, cancel handlers, fail calls."""
        self._stopping.set()
        runner = self._runner
        if runner is not None and runner is not asyncio.current_task():
            with contextlib.suppress(asyncio.CancelledError, AgentSDKError):
                await asyncio.shield(runner)

    async def __aenter__(self) -> Self:
        runner = asyncio.create_task(self.run())
        self._runner = runner
        connected = asyncio.create_task(self._sender.connected.wait())
        done, _ = await asyncio.wait(
            {runner, connected},
            timeout=self.connect_timeout,
            return_when=asyncio.FIRST_COMPLETED,
        )
        connected.cancel()
        if runner in done:
            runner.result()  # raises what stopped it (e.g. RegistrationError)
        if not self._sender.connected.is_set():
            await self.stop()
            raise NotConnectedError(f"could not connect to {', '.join(self.lobby_urls)} in time")
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    def run_forever(self) -> None:
        """Run until SIGINT or SIGTERM: the entry point of an agent script. If the lobby refuses
        the agent (`RegistrationError`) or another process takes it over (`ReplacedError`), the
        script exits with status 1 and one line on stderr naming the cause, not a traceback."""

        async def main() -> None:
            loop = asyncio.get_running_loop()
            for signum in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(signum, self._stopping.set)
            await self.run()

        try:
            asyncio.run(main())
        except AgentSDKError as exc:
            # The cause is the lobby's answer, not a bug in the script: one line says it all.
            raise SystemExit(f"agent {self.agent_id!r} stopped: {exc}") from None

    async def wait_connected(self, timeout: float | None = None) -> None:
        """Return once registered at the lobby; `NotConnectedError` after `timeout`."""
        try:
            async with asyncio.timeout(timeout):
                await self._sender.connected.wait()
        except TimeoutError:
            raise NotConnectedError(f"not connected to {', '.join(self.lobby_urls)}") from None

    async def unregister(self, timeout: float = 5.0) -> None:
        """Leave the lobby for good (its registration and token are dropped), then stop."""
        runner = self._runner
        # Nothing may follow the UNREGISTER on the wire (it would be refused `not_registered`):
        # no ACK from before it starts, and no send at all once it is out (a handler still
        # running gets NotConnectedError here instead).
        self._sender.unregistered = True
        await self.send(LOBBY_ID, MessageType.UNREGISTER, {})
        self._sender.unregistered = True  # a reconnect meanwhile reset it
        self._sender.open = False
        if runner is not None and runner is not asyncio.current_task():
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):
                    await asyncio.wait({runner})
        await self.stop()

    async def update_capabilities(self) -> None:
        """Send the current `capabilities` to the lobby (after changing them at run time)."""
        await self.send(LOBBY_ID, MessageType.UPDATE_CAPABILITIES, self._capabilities_payload())

    async def send(
        self,
        receiver_id: str,
        message_type: MessageType,
        payload: dict[str, Any],
        *,
        conversation_id: str | None = None,
        in_reply_to: str | None = None,
        message_id: str | None = None,
        traceparent: str | None = None,
        timeout_ms: int | None = None,
    ) -> None:
        """Send one raw message (this agent's id and token are filled in). Waits for the
        connection while reconnecting, up to `request_timeout`. Without a `traceparent` it
        carries the trace of the message being handled, if any. `timeout_ms`: a REQUEST's
        deadline, from when the lobby accepts it (PROTOCOL.md §5.2)."""
        message = Message(
            self.agent_id,
            receiver_id,
            message_type,
            payload,
            conversation_id,
            message_id=message_id,
            in_reply_to=in_reply_to,
            traceparent=traceparent,
            timeout_ms=timeout_ms,
        )
        await self._sender.send(message)

    def new_id(self) -> str:
        """An id no other message or conversation of this agent object has: a random prefix
        drawn once (so a restarted agent never reuses one within the lobby's dedupe horizon)
        and a counter, several times cheaper than a uuid4 per message."""
        return f"{self._id_prefix}-{next(self._ids)}"

    def capability_models(self) -> list[Capability]:
        """The capabilities as announced to the lobby."""
        return [spec.to_capability() for spec in self.capabilities.values()]

    # -- internals: connection ------------------------------------------------------------

    async def _serve(self) -> None:
        self.status = Status.CONNECTING
        sender = self._sender

        async def token_for(announced: str | None) -> str | None:
            sender.token = await self._identity.token_for(announced)
            return sender.token

        links = registered_links(
            self.lobby_urls,
            agent_id=self.agent_id,
            register_payload=self._capabilities_payload,
            token=token_for,
            max_delay=self.reconnect_max_delay,
            open_timeout=min(self.connect_timeout, 10.0),
            ssl_context=self.ssl_context,
        )
        async with contextlib.aclosing(links):
            try:
                await self._serve_links(links)
            except RegistrationError as exc:
                raise self._identity.refusal(exc, sender.token) from None

    async def _serve_links(self, links: AsyncIterator[tuple[Link, Registration]]) -> None:
        sender = self._sender
        async for link, registration in links:
            sender.token = registration.token
            await self._identity.keep(registration.token, registration.resumed)
            self._dispatcher.registered(resumed=registration.resumed)
            if not await sender.resend(link):
                continue
            self.status = Status.CONNECTED
            self.stats.connects += 1
            self.stats.resumes += registration.resumed
            log.info("AGENT_CONNECTED", agent_id=self.agent_id, resumed=registration.resumed)
            sender.attach(link)
            for again in self._after_connect:
                again()
            await self._hook(self.on_connected)
            try:
                await link.serve(self._reader.receive)
            finally:
                sender.detach(link)
            log.info(
                "AGENT_DISCONNECTED",
                agent_id=self.agent_id,
                close_code=link.close_code,
                close=close_code_name(link.close_code),
            )
            await self._hook(self.on_disconnected)
            if link.close_code == CloseCode.UNREGISTERED:
                sender.token = None
                await self._identity.forget()
                return  # unregistered (or token revoked): coming back would be a new agent
            if link.close_code == CloseCode.REPLACED:
                # Another process resumed with our token; coming back would start a tug of war.
                raise ReplacedError(f"agent {self.agent_id!r} was resumed by another connection")
            if not self.reconnect:
                return
            self.status = Status.RECONNECTING
            self.stats.reconnects += 1

    async def _settle_before_stop(self) -> None:
        """A clean stop: wait (up to `stop_timeout`) for the lobby's ACCEPTED of all sent, then
        ACK what was processed (see `Sender.open`)."""
        unconfirmed = await self._sender.wait_confirmed(self.stop_timeout)
        if unconfirmed:
            log.warning("STOPPED_UNCONFIRMED", agent_id=self.agent_id, count=unconfirmed)
        self._sender.open = False
        await self._sender.ack_now()

    async def _shutdown(self) -> None:
        self._sender.open = False
        link = self._sender.link
        if link is not None:
            await link.close()
        await self._handlers.cancel_all()
        self._outstanding.fail_all(NotConnectedError(f"agent {self.agent_id!r} stopped"))
        self._sender.connected.clear()
        self.status = Status.STOPPED

    def _capabilities_payload(self) -> dict[str, Any]:
        return {
            # Unset fields left out, not null: generated clients iterate lists without a check.
            "capabilities": [
                c.model_dump(mode="json", exclude_none=True) for c in self.capability_models()
            ],
            "acks": True,
        }

    async def _hook(self, hook: Callable[[], Awaitable[None]]) -> None:
        try:
            await hook()
        except Exception:
            log.exception("HOOK_FAILED", agent_id=self.agent_id, hook=hook.__name__)
