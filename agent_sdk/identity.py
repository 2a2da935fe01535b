"""An agent's identity across restarts: where its auth token is kept, and what a refusal means.

The lobby knows an agent by its id and the token it issued at the first REGISTER; an agent that
comes back without that token is refused (`agent_id_taken`). So the SDK keeps the token:

- `Agent(..., token="...")`: an explicit token, resumed with first.
- `token_store=`: where a token is loaded from at start and saved to when the lobby issues one
  (deleted when the agent unregisters). The default, `FileTokenStore()`, keeps one file per
  (lobby host:port, agent id) under the state directory: `$AGENT_LOBBY_STATE_DIR`, else
  `$XDG_STATE_HOME/agent-lobby`, else `~/.local/state/agent-lobby`; the file (mode 0600, in
  directories of mode 0700) is `tokens/<host>_<port>/<agent id>.token`, replaced atomically.
  `EnvTokenStore("VAR")` reads the token from an environment variable (for a container with
  no durable disk: copy the token there once); `MemoryTokenStore()` keeps it only in this
  process; `None` keeps it only in the agent object (reconnects still resume).

On start the agent resumes with the explicit or saved token; it registers fresh only when it
has none, or when the lobby has forgotten the agent (a lobby that lost its state takes the
unknown token as a new registration and issues a new one, which is saved).
Two processes that share a token (one store, one id) do not fight over it: the later one
resumes, and the earlier one, closed with 4001, stops with `ReplacedError`.

When the lobby refuses the token (`TokenRefusedError`), or the id is taken and this agent has
no token for it (`AgentIdTakenError`), the token is lost for that lobby. The lobby has no
command to free an id yet. Run the agent under another id, or, for a lobby you run yourself,
start it with a new `--data-dir` (which forgets every agent). Deleting the token file does not
free the id. Tokens are never logged.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
from pathlib import Path
from typing import Final, Protocol
from urllib.parse import quote, urlsplit

from agent_sdk.errors import AgentIdTakenError, RegistrationError, TokenRefusedError
from agent_sdk.logs import log
from protocol.models import ErrorCode

STATE_DIR_ENV: Final = "AGENT_LOBBY_STATE_DIR"


class TokenStore(Protocol):
    """Where an agent's token is kept between runs. Calls are rare (start, registration,
    unregister) and may block briefly: the SDK runs them in a worker thread."""

    def load(self, lobby_url: str, agent_id: str) -> str | None:
        """The token saved for this agent at this lobby, or None."""

    def save(self, lobby_url: str, agent_id: str, token: str) -> None:
        """Keep `token`, replacing any saved before."""

    def delete(self, lobby_url: str, agent_id: str) -> None:
        """Forget the token (the agent unregistered)."""

    def where(self, lobby_url: str, agent_id: str) -> str:
        """Where the token is kept, for error messages (never the token itself)."""


def state_dir() -> Path:
    """The SDK's state directory: `$AGENT_LOBBY_STATE_DIR`, else the XDG state home's."""
    explicit = os.environ.get(STATE_DIR_ENV)
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_STATE_HOME")
    base = Path(xdg) if xdg and os.path.isabs(xdg) else Path.home() / ".local" / "state"
    return base / "agent-lobby"


def lobby_key(lobby_url: str) -> str:
    """`host_port` of a lobby URL, safe as a file name: tokens of two lobbies never mix."""
    parts = urlsplit(lobby_url)
    port = parts.port or (443 if parts.scheme in ("wss", "https") else 80)
    return quote(f"{parts.hostname or 'localhost'}_{port}", safe="-_.")


class FileTokenStore:
    """One file per (lobby, agent), mode 0600, under `directory` (default: `state_dir()`,
    read at each call)."""

    def __init__(self, directory: Path | str | None = None) -> None:
        self.directory = Path(directory) if directory is not None else None

    def path(self, lobby_url: str, agent_id: str) -> Path:
        root = self.directory if self.directory is not None else state_dir()
        # Agent ids may hold `.`, `:` and `@`: quoted, and with a suffix, a name is never
        # `..` or a path.
        return root / "tokens" / lobby_key(lobby_url) / f"{quote(agent_id, safe='-_.')}.token"

    def load(self, lobby_url: str, agent_id: str) -> str | None:
        try:
            token = self.path(lobby_url, agent_id).read_text(encoding="utf-8").strip()
        except FileNotFoundError:
            return None
        return token or None

    def save(self, lobby_url: str, agent_id: str, token: str) -> None:
        path = self.path(lobby_url, agent_id)
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

    def delete(self, lobby_url: str, agent_id: str) -> None:
        self.path(lobby_url, agent_id).unlink(missing_ok=True)

    def where(self, lobby_url: str, agent_id: str) -> str:
        return f"file {self.path(lobby_url, agent_id)}"


class MemoryTokenStore:
    """Tokens in this process only: agent objects of one process share them."""

    def __init__(self) -> None:
        self._tokens: dict[tuple[str, str], str] = {}

    def load(self, lobby_url: str, agent_id: str) -> str | None:
        return self._tokens.get((lobby_key(lobby_url), agent_id))

    def save(self, lobby_url: str, agent_id: str, token: str) -> None:
        self._tokens[lobby_key(lobby_url), agent_id] = token

    def delete(self, lobby_url: str, agent_id: str) -> None:
        self._tokens.pop((lobby_key(lobby_url), agent_id), None)

    def where(self, lobby_url: str, agent_id: str) -> str:
        return "this process's memory"


class EnvTokenStore:
    """The token in environment variable `variable`, read-only: a token the lobby issues
    anew (it had forgotten the agent) is kept in memory and a warning says the variable is
    stale."""

    def __init__(self, variable: str) -> None:
        self.variable = variable
        self._issued: str | None = None

    def load(self, lobby_url: str, agent_id: str) -> str | None:
        return self._issued or os.environ.get(self.variable) or None

    def save(self, lobby_url: str, agent_id: str, token: str) -> None:
        if token != os.environ.get(self.variable):
            self._issued = token
            log.warning(
                "TOKEN_NOT_SAVED",
                agent_id=agent_id,
                error=f"the lobby issued a token that ${self.variable} does not hold",
            )

    def delete(self, lobby_url: str, agent_id: str) -> None:
        self._issued = None

    def where(self, lobby_url: str, agent_id: str) -> str:
        return f"environment variable {self.variable}"


DEFAULT_TOKEN_STORE: Final = FileTokenStore()


class Identity:
    """One agent's token: where it came from, and keeping it in the store. `AgentCore` calls
    `load()` at start, `keep()` after each REGISTER_ACK, `forget()` once unregistered, and
    `refusal()` when REGISTER is refused."""

    def __init__(
        self, agent_id: str, lobby_url: str, token: str | None, store: TokenStore | None
    ) -> None:
        self.agent_id = agent_id
        self.lobby_url = lobby_url
        self.store = store
        self._explicit = token
        self._kept: str | None = None
        self.source: str | None = None
        """Where the token presented at REGISTER came from, for error messages."""

    def _where(self) -> str:
        if self.store is None:
            return "this agent object's memory (no token store)"
        return self.store.where(self.lobby_url, self.agent_id)

    async def load(self) -> str | None:
        """The token to resume with at start: the explicit one, else the saved one."""
        if self._explicit is not None:
            self._kept, self.source = self._explicit, "the token= argument"
            return self._explicit
        if self.store is None:
            return None
        token = await asyncio.to_thread(self.store.load, self.lobby_url, self.agent_id)
        self._kept, self.source = token, self._where()
        return token

    async def keep(self, token: str) -> None:
        """Save a token the lobby issued, unless it is the one already kept. A store that
        fails is logged, not raised: the agent runs, only its restart would be refused."""
        if token == self._kept:
            return
        self._kept, self.source = token, self._where()
        if self._explicit is not None:
            log.warning(
                "TOKEN_REISSUED",
                agent_id=self.agent_id,
                error="the lobby had forgotten this agent: the token= argument is stale",
                saved_in=self.source,
            )
        if self.store is None:
            return
        try:
            await asyncio.to_thread(self.store.save, self.lobby_url, self.agent_id, token)
        except OSError as exc:
            log.warning(
                "TOKEN_NOT_SAVED", agent_id=self.agent_id, where=self.source, error=str(exc)
            )

    async def forget(self) -> None:
        """The lobby dropped the registration (UNREGISTER or revoked): the token is void."""
        self._explicit = self._kept = self.source = None
        if self.store is None:
            return
        try:
            await asyncio.to_thread(self.store.delete, self.lobby_url, self.agent_id)
        except OSError as exc:
            log.warning("TOKEN_NOT_DELETED", agent_id=self.agent_id, error=str(exc))

    def refusal(self, error: RegistrationError, presented: str | None) -> RegistrationError:
        """The exception to raise for a refused REGISTER: `agent_id_taken` is explained
        (which token, where it is kept, what to do); anything else is returned as is."""
        if error.code != ErrorCode.AGENT_ID_TAKEN:
            return error
        remedy = (
            "the lobby has no command to free an id yet: run this agent under another id, "
            "or start the lobby with a new --data-dir (it forgets every agent)"
        )
        if presented is not None:
            return TokenRefusedError(
                f"the lobby at {self.lobby_url} refused the token of agent id "
                f"{self.agent_id!r} from {self.source}: the id is registered there under "
                "another token (the lobby's state was reset and the id registered again, or "
                f"the token is for another lobby); {remedy}",
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
