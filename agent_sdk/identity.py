"""An agent's identity across restarts: where its auth token is kept, and what a refusal means.

The lobby knows an agent by its id and the token it issued at the first REGISTER; an agent that
comes back without that token is refused (`agent_id_taken`). So the SDK keeps the token, for
the lobby that issued it:

- Each lobby has an identity of its own, made once with its state (its data dir, or its
  cluster), and announces it in the WebSocket handshake response (header `Agent-Lobby-Id`).
  The SDK reads it before it sends REGISTER and keeps tokens under it: a token issued by one
  lobby is never offered to another, even one that answers later at the same host and port.
  A lobby that announces none (older versions) is known by the `host_port` of the agent's
  first URL instead.
- `Agent(..., token="...")`: an explicit token, offered to the first lobby the agent reaches.
- `token_store=`: where a token is loaded from after each handshake and saved to when the
  lobby issues one (deleted when the agent unregisters). The default, `FileTokenStore()`,
  keeps one file per (lobby, agent id) under the state directory: `$AGENT_LOBBY_STATE_DIR`,
  else `$XDG_STATE_HOME/agent-lobby`, else `~/.local/state/agent-lobby`; the file (mode 0600,
  in directories of mode 0700) is `tokens/<lobby identity>/<agent id>.token` (or
  `tokens/<host>_<port>/...` for a lobby that announces no identity), replaced atomically.
  `EnvTokenStore("VAR")` reads the token from an environment variable (for a container with
  no durable disk: copy the token there once); `MemoryTokenStore()` keeps it only in this
  process; `None` keeps it only in the agent object (reconnects to the same lobby resume).

Tokens saved by earlier versions under `host_port` are moved once: when no token is saved
under the lobby's identity, the one under `host_port` is offered, and if the lobby resumes the
agent with it, it is saved under the identity and the old file deleted (if the lobby does not
know it, the old file stays, for whichever lobby issued it). That first start is the only time
a token may reach a lobby other than its own.

On start the agent resumes with the explicit or saved token; it registers fresh only when it
has none for that lobby, or when the lobby has forgotten the agent (a lobby that lost its state
takes the unknown token as a new registration and issues a new one, which is saved).
Two processes that share a token (one store, one id) do not fight over it: the later one
resumes, and the earlier one, closed with 4001, stops with `ReplacedError`.

When the lobby refuses the token (`TokenRefusedError`), or the id is taken and this agent has
no token for it (`AgentIdTakenError`), the id is held at that lobby by a token this agent does
not have (`lobby revoke` keeps the registration, so a revoked agent's old token is refused
too). Deleting the token file does not free the id; its operator does, with `lobby remove ID`
(or `lobby reset`, which forgets every agent of a development lobby), or run the agent under
another id. Tokens are never logged.
"""

from __future__ import annotations

import asyncio
import os
import re
import tempfile
from pathlib import Path
from typing import Final, Protocol
from urllib.parse import quote, urlsplit

from agent_sdk.errors import AgentIdTakenError, RegistrationError, TokenRefusedError
from agent_sdk.logs import log
from protocol.models import ErrorCode

STATE_DIR_ENV: Final = "AGENT_LOBBY_STATE_DIR"
IDENTITY_HEADER: Final = "Agent-Lobby-Id"
"""The handshake response header in which a lobby announces its identity."""
_IDENTITY = re.compile(r"[0-9a-z-]{8,64}")
"""An identity a lobby may announce: never `_`, so never a `host_port` key."""


class TokenStore(Protocol):
    """Where an agent's token is kept between runs. Calls are rare (connection, registration,
    unregister) and may block briefly: the SDK runs them in a worker thread.

    `lobby` names the lobby the token is for: its identity (`Agent-Lobby-Id`), or, for a
    lobby that announces none, its URL; `lobby_key(lobby)` makes either a file name."""

    def load(self, lobby: str, agent_id: str) -> str | None:
        """The token saved for this agent at this lobby, or None."""

    def save(self, lobby: str, agent_id: str, token: str) -> None:
        """Keep `token`, replacing any saved before."""

    def delete(self, lobby: str, agent_id: str) -> None:
        """Forget the token (the agent unregistered)."""

    def where(self, lobby: str, agent_id: str) -> str:
        """Where the token is kept, for error messages (never the token itself)."""


def state_dir() -> Path:
    """The SDK's state directory: `$AGENT_LOBBY_STATE_DIR`, else the XDG state home's."""
    explicit = os.environ.get(STATE_DIR_ENV)
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_STATE_HOME")
    base = Path(xdg) if xdg and os.path.isabs(xdg) else Path.home() / ".local" / "state"
    return base / "agent-lobby"


def announced_identity(header: str | None) -> str | None:
    """The identity a handshake's `Agent-Lobby-Id` header announces, None for none (an
    older lobby) or one that is not an identity."""
    if header is None or not _IDENTITY.fullmatch(header):
        return None
    return header


def lobby_key(lobby: str) -> str:
    """A lobby's identity as it is, or `host_port` of a lobby URL, safe as a file name: tokens
    of two lobbies never mix."""
    if "://" not in lobby:
        return quote(lobby, safe="-")
    parts = urlsplit(lobby)
    port = parts.port or (443 if parts.scheme in ("wss", "https") else 80)
    return quote(f"{parts.hostname or 'localhost'}_{port}", safe="-_.")


class FileTokenStore:
    """One file per (lobby, agent), mode 0600, under `directory` (default: `state_dir()`,
    read at each call)."""

    def __init__(self, directory: Path | str | None = None) -> None:
        self.directory = Path(directory) if directory is not None else None

    def path(self, lobby: str, agent_id: str) -> Path:
        root = self.directory if self.directory is not None else state_dir()
        # Agent ids may hold `.`, `:` and `@`: quoted, and with a suffix, a name is never
        # `..` or a path.
        return root / "tokens" / lobby_key(lobby) / f"{quote(agent_id, safe='-_.')}.token"

    def load(self, lobby: str, agent_id: str) -> str | None:
        try:
            token = self.path(lobby, agent_id).read_text(encoding="utf-8").strip()
        except FileNotFoundError:
            return None
        return token or None

    def save(self, lobby: str, agent_id: str, token: str) -> None:
        path = self.path(lobby, agent_id)
        for directory in (path.parent.parent.parent, path.parent.parent, path.parent):
            directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        for directory in (path.parent.parent, path.parent):
            directory.chmod(0o700)  # ours alone, whatever the umask made of them
        fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=".", suffix=".tmp")  # 0600
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as file:
                file.write(token + "\n")
                file.flush()
                os.fsync(file.fileno())
            os.replace(temporary, path)
        except BaseException:
            Path(temporary).unlink(missing_ok=True)
            raise
        # The rename itself must survive a crash: losing the file loses the agent id.
        directory_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(directory_fd)
        finally:
            os.close(directory_fd)

    def delete(self, lobby: str, agent_id: str) -> None:
        self.path(lobby, agent_id).unlink(missing_ok=True)

    def where(self, lobby: str, agent_id: str) -> str:
        return f"file {self.path(lobby, agent_id)}"


class MemoryTokenStore:
    """Tokens in this process only: agent objects of one process share them."""

    def __init__(self) -> None:
        self._tokens: dict[tuple[str, str], str] = {}

    def load(self, lobby: str, agent_id: str) -> str | None:
        return self._tokens.get((lobby_key(lobby), agent_id))

    def save(self, lobby: str, agent_id: str, token: str) -> None:
        self._tokens[lobby_key(lobby), agent_id] = token

    def delete(self, lobby: str, agent_id: str) -> None:
        self._tokens.pop((lobby_key(lobby), agent_id), None)

    def where(self, lobby: str, agent_id: str) -> str:
        return "this process's memory"


class EnvTokenStore:
    """The token in environment variable `variable`, read-only: a token the lobby issues
    anew (it had forgotten the agent) is kept in memory and a warning says the variable is
    stale."""

    def __init__(self, variable: str) -> None:
        self.variable = variable
        self._issued: str | None = None

    def load(self, lobby: str, agent_id: str) -> str | None:
        return self._issued or os.environ.get(self.variable) or None

    def save(self, lobby: str, agent_id: str, token: str) -> None:
        if token != os.environ.get(self.variable):
            self._issued = token
            log.warning(
                "TOKEN_NOT_SAVED",
                agent_id=agent_id,
                error=f"the lobby issued a token that ${self.variable} does not hold",
            )

    def delete(self, lobby: str, agent_id: str) -> None:
        self._issued = None

    def where(self, lobby: str, agent_id: str) -> str:
        return f"environment variable {self.variable}"


DEFAULT_TOKEN_STORE: Final = FileTokenStore()


class Identity:
    """One agent's token, for the lobby it reaches: where it came from, and keeping it in the
    store. After each handshake the connection calls `token_for()` with the identity the lobby
    announced; `AgentCore` calls `keep()` after each REGISTER_ACK, `forget()` once
    unregistered, and `refusal()` when REGISTER is refused."""

    def __init__(
        self, agent_id: str, lobby_url: str, token: str | None, store: TokenStore | None
    ) -> None:
        self.agent_id = agent_id
        self.lobby_url = lobby_url
        """The agent's first URL: the key of a lobby that announces no identity."""
        self.store = store
        self._explicit = token
        self._lobby: str | None = None
        """The lobby `_kept` belongs to (`TokenStore`'s `lobby`); None before a handshake."""
        self._kept: str | None = None
        self._legacy = False
        """`_kept` came from the `host_port` key: moved under the identity once resumed."""
        self.source: str | None = None
        """Where the token presented at REGISTER came from, for error messages."""

    @property
    def lobby(self) -> str:
        """The lobby tokens are kept for now: its identity, or the agent's first URL."""
        return self._lobby or self.lobby_url

    def _where(self, lobby: str | None = None) -> str:
        if self.store is None:
            return "this agent object's memory (no token store)"
        return self.store.where(lobby or self.lobby, self.agent_id)

    async def token_for(self, announced: str | None) -> str | None:
        """The token to offer the lobby that announced identity `announced` (None: it
        announced none): the one kept for it, else the explicit one at the first lobby, else
        the one saved for it; never one kept for another lobby."""
        lobby = announced or self.lobby_url
        if lobby == self._lobby:
            return self._kept
        first, self._lobby, self._legacy = self._lobby is None, lobby, False
        self._kept = self.source = None
        if self._explicit is not None:
            if first:
                self._kept, self.source = self._explicit, "the token= argument"
                return self._kept
            self._explicit = None  # it was for the lobby first reached, not for this one
        if self.store is None:
            return None
        token = await asyncio.to_thread(self.store.load, lobby, self.agent_id)
        if token is not None:
            self._kept, self.source = token, self._where()
        elif announced is not None:
            token = await asyncio.to_thread(self.store.load, self.lobby_url, self.agent_id)
            if token is not None:
                self._kept, self._legacy = token, True
                self.source = self._where(self.lobby_url)
        return token

    async def keep(self, token: str, resumed: bool) -> None:
        """Save a token the lobby issued, unless it is the one already kept; a token moved
        from the `host_port` key that the lobby `resumed` with is saved under the identity and
        its old file deleted. A store that fails is logged, not raised: the agent runs, only
        its restart would be refused."""
        legacy, self._legacy = self._legacy, False
        if token == self._kept and not legacy:
            return
        if token != self._kept and self._explicit is not None:
            log.warning(
                "TOKEN_REISSUED",
                agent_id=self.agent_id,
                error="the lobby had forgotten this agent: the token= argument is stale",
                saved_in=self._where(),
            )
        self._kept, self.source = token, self._where()
        if self.store is None:
            return
        try:
            await asyncio.to_thread(self.store.save, self.lobby, self.agent_id, token)
            if legacy and resumed:
                await asyncio.to_thread(self.store.delete, self.lobby_url, self.agent_id)
        except OSError as exc:
            log.warning(
                "TOKEN_NOT_SAVED", agent_id=self.agent_id, where=self.source, error=str(exc)
            )

    async def forget(self) -> None:
        """The lobby dropped the registration (UNREGISTER or revoked): the token is void."""
        self._explicit = self._kept = self.source = None
        if self.store is None or self._lobby is None:
            return
        try:
            await asyncio.to_thread(self.store.delete, self._lobby, self.agent_id)
        except OSError as exc:
            log.warning("TOKEN_NOT_DELETED", agent_id=self.agent_id, error=str(exc))

    def refusal(self, error: RegistrationError, presented: str | None) -> RegistrationError:
        """The exception to raise for a refused REGISTER: `agent_id_taken` is explained
        (which token, where it is kept, what to do); anything else is returned as is."""
        if error.code != ErrorCode.AGENT_ID_TAKEN:
            return error
        remedy = (
            f"to free the id, its operator runs `lobby remove {self.agent_id}` (for a "
            "development lobby, `lobby reset` forgets every agent), or run this agent under "
            "another id; deleting the token file does not free it"
        )
        if presented is not None and "revoked" in str(error):
            # The id is free for a REGISTER without a token: only the saved one is in the way.
            return TokenRefusedError(
                f"the lobby at {self.lobby_url} refused the token of agent id "
                f"{self.agent_id!r} from {self.source}: an operator revoked it; delete it "
                f"({self.source}) and start the agent again to register under a new token",
                agent_id=self.agent_id,
                source=self.source,
            )
        if presented is not None:
            return TokenRefusedError(
                f"the lobby at {self.lobby_url} refused the token of agent id "
                f"{self.agent_id!r} from {self.source}: the id is registered there under "
                "another token (the lobby's state was reset and the id registered again, "
                f"or another process registered it); {remedy}",
                agent_id=self.agent_id,
                source=self.source,
            )
        return AgentIdTakenError(
            f"agent id {self.agent_id!r} is registered at {self.lobby_url} and this agent "
            f"has no token for it (looked in {self._where()}): another process runs this "
            f"agent, or its token was lost; {remedy}",
            agent_id=self.agent_id,
            source=None,
        )
