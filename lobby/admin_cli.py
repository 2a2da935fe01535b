"""`lobby revoke AGENT_ID...` and `lobby remove AGENT_ID...`: an operator takes agents' tokens,
or the agents themselves, away.

While a lobby holds the data dir (its lock file says so) the command goes through that lobby's
/admin endpoint (`--url`, default ws://LOBBY_HOST:LOBBY_PORT/admin), authenticated by
`--admin-token`, else `LOBBY_ADMIN_TOKEN`, else the token the lobby wrote to
`DATA_DIR/admin.token`: the agent's connection is closed with 4003 at once. With no lobby
running, the change is written to the store directly, and the next start finds it. Either way
it is committed before the command returns 0. Several ids are handled in turn, each with its
line on stdout; an unknown agent is one line on stderr (the others are still handled) and exit
status 1, as is a lobby that cannot be reached.
"""

from __future__ import annotations

import argparse
import contextlib
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import orjson
from websockets.exceptions import InvalidStatus, WebSocketException
from websockets.sync.client import ClientConnection, connect

from lobby.admin_endpoint import PATH, TOKEN_FILE
from lobby.core.records import AgentRemoved, AgentSaved
from lobby.core.session import REVOKED
from lobby.store.sqlite import FILE_NAME, SqliteStore, StoreLocked

COMMANDS = {
    "revoke": "revoke an agent's token: its connection is closed, the next REGISTER of its id "
    "gets a new token (its capabilities and held messages stay)",
    "remove": "remove an agent: its token, capabilities and held messages are gone",
}


class AdminFailed(Exception):
    """The command could not be carried out, for a reason one line tells."""


class UnknownAgent(Exception):
    """One of the ids is not registered: the others are still handled."""


def add_commands(commands: argparse._SubParsersAction[Any]) -> None:
    """Add `revoke` and `remove` to the `lobby` command line."""
    data_dir = Path(os.environ.get("LOBBY_DATA_DIR") or ".lobby")
    for name, help_text in COMMANDS.items():
        command = commands.add_parser(name, help=help_text, description=help_text + ".")
        command.add_argument("agent_ids", nargs="+", metavar="AGENT_ID")
        command.add_argument(
            "--data-dir", type=Path, default=data_dir, help="the lobby's data dir (%(default)s)"
        )
        command.add_argument(
            "--url",
            help="the running lobby's admin endpoint, ws[s]://HOST:PORT/admin; given, the "
            "command always goes there (default: ws://LOBBY_HOST:LOBBY_PORT/admin when a "
            "lobby holds the data dir, else the store is changed directly)",
        )
        command.add_argument(
            "--admin-token",
            help="the lobby's admin token (default: LOBBY_ADMIN_TOKEN, else the token file "
            f"DATA_DIR/{TOKEN_FILE} the lobby wrote)",
        )


def run(args: argparse.Namespace) -> tuple[list[str], list[str]]:
    """Carry out `args.command` for each of `args.agent_ids`: the lines to print for those
    done, and for those refused (an unknown id). Raises `AdminFailed` when nothing can be
    done (no store, no lobby to ask, a refused admin token)."""
    remove = args.command == "remove"
    if args.url is None:
        if not (args.data_dir / FILE_NAME).exists():
            raise AdminFailed(
                f"no lobby store at {args.data_dir / FILE_NAME} (is --data-dir right?)"
            )
        try:
            store = SqliteStore(args.data_dir)
        except StoreLocked:
            pass  # a lobby runs on it: ask that lobby
        else:
            try:
                return _in_turn(args.agent_ids, lambda agent_id: _offline(store, agent_id, remove))
            finally:
                store.close()
    url, token = args.url or _default_url(), _token(args)
    done = "removed agent" if remove else "revoked the token of agent"
    with _admin(url, token) as ws:

        def online(agent_id: str) -> str:
            answer = _ask(ws, url, args.command, agent_id)
            closed = "; its connection was closed" if answer.get("was_online") else ""
            return f"{done} {agent_id!r}{closed}"

        return _in_turn(args.agent_ids, online)


def _in_turn(agent_ids: list[str], one: Callable[[str], str]) -> tuple[list[str], list[str]]:
    done: list[str] = []
    refused: list[str] = []
    for agent_id in dict.fromkeys(agent_ids):  # each once, in the order given
        try:
            done.append(one(agent_id))
        except UnknownAgent as unknown:
            refused.append(str(unknown))
    return done, refused


def _offline(store: SqliteStore, agent_id: str, remove: bool) -> str:
    saved = store.agent(agent_id)
    if saved is None:
        raise UnknownAgent(f"no agent {agent_id!r} is registered in this store (see lobby agents)")
    if remove:
        store.write([AgentRemoved(agent_id)])
        return f"removed agent {agent_id!r} (no lobby was running: changed in the store)"
    store.write([AgentSaved(agent_id, REVOKED, saved.capabilities, saved.acks)])
    return f"revoked the token of agent {agent_id!r} (no lobby was running: changed in the store)"


def _default_url() -> str:
    host = os.environ.get("LOBBY_HOST") or "127.0.0.1"
    if host in ("0.0.0.0", "::", ""):  # listening everywhere: ask it locally
        host = "127.0.0.1"
    port = os.environ.get("LOBBY_PORT") or "8765"
    return f"ws://{host}:{port}{PATH}"


def _token(args: argparse.Namespace) -> str:
    token: str | None = args.admin_token or os.environ.get("LOBBY_ADMIN_TOKEN")
    if token:
        return token
    path: Path = args.data_dir / TOKEN_FILE
    try:
        return path.read_text().strip()
    except OSError:
        raise AdminFailed(
            f"no admin token: give --admin-token or LOBBY_ADMIN_TOKEN (no readable {path})"
        ) from None


@contextlib.contextmanager
def _admin(url: str, token: str) -> Iterator[ClientConnection]:
    """One /admin connection for every id of the command."""
    headers = {"Authorization": f"Bearer {token}"}
    try:
        with connect(url, additional_headers=headers, open_timeout=10, close_timeout=2) as ws:
            yield ws
    except InvalidStatus as refused:
        status = refused.response.status_code
        if status == 401:
            raise AdminFailed(f"the lobby at {url} refused the admin token (401)") from None
        raise AdminFailed(f"the lobby at {url} answered HTTP {status}, not /admin") from None
    except (OSError, TimeoutError, WebSocketException) as exc:
        raise AdminFailed(f"cannot reach the lobby's admin endpoint at {url}: {exc}") from None


def _ask(ws: ClientConnection, url: str, command: str, agent_id: str) -> dict[str, object]:
    try:
        ws.send(orjson.dumps({"command": command, "agent_id": agent_id}).decode())
        answer: dict[str, object] = orjson.loads(ws.recv(timeout=30))
    except (OSError, TimeoutError, WebSocketException) as exc:
        raise AdminFailed(f"cannot reach the lobby's admin endpoint at {url}: {exc}") from None
    if answer.get("ok"):
        return answer
    if answer.get("code") == "unknown_agent":
        raise UnknownAgent(str(answer.get("error")))
    raise AdminFailed(str(answer.get("error")))


__all__ = ["COMMANDS", "AdminFailed", "add_commands", "run"]
