"""The /admin endpoint: a WebSocket on the lobby's port for operators (`lobby revoke`,
`lobby remove`, the dashboard), opened with the admin token (`Authorization: Bearer TOKEN`).
A browser cannot set that header on a WebSocket: it opens `/admin?auth=message` instead, and
its first message must be `{"command": "auth", "token": TOKEN}`; until then any other command
is refused and closes the connection, and it is closed if the token does not come within the
handshake timeout. (The token never travels in a URL, which proxies log.)

Its protocol (PROTOCOL.md, "The /admin endpoint"): one JSON object per text frame each way.

    -> {"command": "revoke", "agent_id": "seller-1", "id": 7}
    <- {"ok": true, "command": "revoke", "agent_id": "seller-1", "was_online": true, "id": 7}
    <- {"ok": false, "code": "unknown_agent", "error": "...", "command": "revoke", "id": 7}

A command is answered once what it changed is committed to the store. `id` (any JSON value,
optional) is echoed, so answers can be matched when several are in flight, and told apart
from the events a streaming command (`observe`) sends, which carry `event`
instead of `ok`. New commands are new entries in `AdminEndpoint.commands`.

The token is `--admin-token`, or the one kept in `DATA_DIR/admin.token` (mode 0600) for the
sqlite store: made at the first start and kept across restarts, so an open dashboard
reconnects by itself; deleting the file before a start rotates it. With the memory store a
new one is printed once on stderr at each start. It is never logged. A wrong token is
answered "wrong admin token: see WHERE", WHERE naming where this lobby's token is.
"""

from __future__ import annotations

import hmac
import os
import secrets
import sys
from collections.abc import Callable
from http import HTTPStatus
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import orjson
import structlog

from lobby.core.session import Close, Session
from lobby.transport.base import HttpAnswer
from protocol.limits import clip
from protocol.models import CloseCode

if TYPE_CHECKING:
    from collections.abc import Coroutine, Iterable

    from lobby.committer import Committer
    from lobby.core.router import Router
    from lobby.core.session import Action
    from lobby.observer import Observers


class Server(Protocol):
    """What the /admin endpoint uses of the server (`lobby.server.LobbyServer`)."""

    router: Router
    committer: Committer
    observers: Observers

    def execute(self, actions: Iterable[Action]) -> None: ...
    def send(self, session: Session, frame: bytes) -> None: ...
    def spawn(self, work: Coroutine[Any, Any, None]) -> None: ...


log = structlog.get_logger("lobby.admin")

TOKEN_FILE = "admin.token"  # noqa: S105  # a file name, not a secret
PATH = "/admin"
BROWSER_QUERY = "auth=message"
"""`/admin?auth=message`: the token comes in the first message, not in a header."""

Answer = dict[str, Any]
MIN_TOKEN = 16
"""Characters an admin token has at least (`--admin-token` is held to the same)."""


def kept_token(data_dir: Path | None) -> str | None:
    """The token a previous start wrote to `data_dir/admin.token`, if it is there and long
    enough to be one (a truncated or emptied file gets a new token)."""
    if data_dir is None:
        return None
    try:
        token = (data_dir / TOKEN_FILE).read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None
    return token if len(token) >= MIN_TOKEN else None


def choose_token(given: str | None, data_dir: Path | None) -> tuple[str, str]:
    """The admin token for a start, and where an operator finds it: `given`
    (`--admin-token`), else the one kept in `data_dir` (so open dashboards reconnect after a
    restart), else a new one that `publish_token` makes known once the lobby listens."""
    if given is not None:
        return given, "the --admin-token (LOBBY_ADMIN_TOKEN) the lobby was started with"
    token = kept_token(data_dir) or secrets.token_urlsafe(32)
    if data_dir is None:
        return token, "the lobby's stderr at start (printed once)"
    return token, str(data_dir / TOKEN_FILE)


def publish_token(token: str, data_dir: Path | None) -> None:
    """Make a generated or kept admin token known, once the lobby listens (a start that
    fails replaces no file): written to `data_dir/admin.token` (mode 0600, whatever mode an
    older run left it with), or, without a data dir, printed once on stderr."""
    if data_dir is None:
        sys.stderr.write(f"lobby: admin token (for /admin, lobby revoke/remove): {token}\n")
        return
    path = data_dir / TOKEN_FILE
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)  # a file left by an older run may have had another mode
        os.write(fd, f"{token}\n".encode())
    finally:
        os.close(fd)


class AdminEndpoint:
    """The /admin connections of one lobby: `admit` checks the token, `received` runs a
    command."""

    def __init__(self, server: Server, token: str, sessions: set[Session], *, where: str) -> None:
        self._server = server
        self._token = token.encode()
        self.where = where
        """Where an operator finds the token (`DATA_DIR/admin.token`, ...), told to whoever
        presents a wrong one."""
        self.sessions = sessions
        """The open /admin connections (the server checks membership for each message that
        comes from a connection without an agent)."""
        self.unproven: set[Session] = set()
        """Connections opened with `?auth=message` that have not sent the token yet."""
        self.observers: Observers = server.observers
        self.commands: dict[str, Callable[[Session, dict[str, Any], Answer], None]] = {
            "revoke": self._revoke,
            "remove": self._remove,
            "observe": self._observe,
            "conversation": self._conversation,
        }

    def admit(self, authorization: str | None, query: str = "") -> HttpAnswer | None:
        """None to open the WebSocket, or a 401 when the token is missing or wrong (unless
        the query asks for it in the first message)."""
        if authorization is None and query == BROWSER_QUERY:
            return None
        scheme, _, presented = (authorization or "").partition(" ")
        if scheme.lower() == "bearer" and self._proves(presented):
            return None
        log.warning("ADMIN_AUTHENTICATION_FAILED", presented=bool(presented))
        error = "/admin needs the header 'Authorization: Bearer ADMIN_TOKEN' with the lobby's token"
        if presented:
            error = f"wrong admin token: see {self.where}"
        return HttpAnswer.json(HTTPStatus.UNAUTHORIZED, {"error": error, "code": "auth_failed"})

    def _proves(self, presented: str) -> bool:
        return hmac.compare_digest(presented.strip().encode(), self._token)

    def opened(self, session: Session, query: str) -> bool:
        """An /admin connection is open; True if it still has to send the token."""
        self.sessions.add(session)
        if query == BROWSER_QUERY:
            self.unproven.add(session)
            return True
        return False

    def closed(self, session: Session) -> None:
        self.sessions.discard(session)
        self.unproven.discard(session)
        self.observers.left(session)

    def received(self, session: Session, binary: bool, data: bytes) -> None:
        try:
            request = orjson.loads(data)
        except orjson.JSONDecodeError:
            request = None
        if binary or not isinstance(request, dict):
            self._fail(session, {}, "malformed", "send one JSON object per text frame")
            return
        name = request.get("command")
        answer: Answer = {"command": name}
        if "id" in request:
            answer["id"] = request["id"]
        if session in self.unproven:
            self._authenticate(session, request, answer)
            return
        command = self.commands.get(name) if isinstance(name, str) else None
        if command is None:
            known = ", ".join(self.commands)
            reason = f"unknown command {clip(str(name))!r}: one of {known}"
            self._fail(session, answer, "unknown_command", reason)
            return
        command(session, request, answer)

    def _authenticate(self, session: Session, request: dict[str, Any], answer: Answer) -> None:
        token = request.get("token")
        if answer["command"] == "auth" and isinstance(token, str) and self._proves(token):
            self.unproven.discard(session)
            self._send(session, {"ok": True, **answer})
            return
        log.warning("ADMIN_AUTHENTICATION_FAILED", presented=isinstance(token, str))
        if answer["command"] == "auth" and isinstance(token, str):
            reason = f"wrong admin token: see {self.where}"
        else:
            reason = "the first message must be {'command': 'auth', 'token': ADMIN_TOKEN}"
        self._fail(session, answer, "auth_failed", reason)
        self._server.execute([Close(session, CloseCode.POLICY_VIOLATION, "auth_failed")])

    def _observe(self, session: Session, request: dict[str, Any], answer: Answer) -> None:
        self.observers.observe(session, answer)

    def _conversation(self, session: Session, request: dict[str, Any], answer: Answer) -> None:
        key = request.get("key")
        if not isinstance(key, str):
            reason = "conversation needs a string 'key': a conversation, dialogue or trace id"
            self._fail(session, answer, "malformed", reason)
            return
        messages = self.observers.find(key)
        self._send(session, {"ok": True, **answer, "key": key, "messages": messages})

    def _revoke(self, session: Session, request: dict[str, Any], answer: Answer) -> None:
        self._take_away(session, request, answer, remove=False)

    def _remove(self, session: Session, request: dict[str, Any], answer: Answer) -> None:
        self._take_away(session, request, answer, remove=True)

    def _take_away(
        self, session: Session, request: dict[str, Any], answer: Answer, *, remove: bool
    ) -> None:
        agent_id = request.get("agent_id")
        if not isinstance(agent_id, str):
            reason = f"{answer['command']} needs a string 'agent_id'"
            self._fail(session, answer, "malformed", reason)
            return
        answer["agent_id"] = agent_id
        server = self._server
        actions = server.router.revoke(agent_id, remove=remove)
        if actions is None:
            reason = f"no agent {clip(agent_id)!r} is registered in this lobby"
            self._fail(session, answer, "unknown_agent", reason)
            return
        answer["was_online"] = any(isinstance(a, Close) for a in actions)  # not PRESENCE
        server.execute(actions)
        server.spawn(self._answer_once_committed(session, answer))

    async def _answer_once_committed(self, session: Session, answer: Answer) -> None:
        committer = self._server.committer
        failed_before = committer.failed
        await committer.flush()
        if committer.failed and not failed_before:
            reason = "the store failed to write the change; see the lobby's log"
            self._fail(session, answer, "internal", reason)
            return
        self._send(session, {"ok": True, **answer})

    def _fail(self, session: Session, answer: Answer, code: str, reason: str) -> None:
        self._send(session, {"ok": False, "code": code, "error": reason, **answer})

    def _send(self, session: Session, answer: Answer) -> None:
        self._server.send(session, orjson.dumps(answer))


__all__ = [
    "BROWSER_QUERY",
    "MIN_TOKEN",
    "PATH",
    "TOKEN_FILE",
    "AdminEndpoint",
    "choose_token",
    "kept_token",
    "publish_token",
]
