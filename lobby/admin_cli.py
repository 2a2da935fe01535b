"""`lobby revoke AGENT_ID` and `lobby remove AGENT_ID`: an operator takes an agent's token, or
the agent itself, away.

While a lobby holds the data dir (its lock file says so) the command goes through that lobby's
/admin endpoint (`--url`, default ws://LOBBY_HOST:LOBBY_PORT/admin), authenticated by
`--admin-token`, else `LOBBY_ADMIN_TOKEN`, else the token the lobby wrote to
`DATA_DIR/admin.token`: the agent's connection is closed with 4003 at once. With no lobby
running, the change is written to the store directly, and the next start finds it. Either way
it is committed before the command returns 0; an unknown agent (or a lobby that cannot be
reached) is one line on stderr and exit status 1.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

import orjson
from websockets.exceptions import InvalidStatus, WebSocketException
from websockets.sync.client import connect

from lobby.admin_endpoint import PATH, TOKEN_FILE
from lobby.core.records import AgentRemoved, AgentSaved
from lobby.core.registry import REVOKED
from lobby.store.sqlite import FILE_NAME, SqliteStore, StoreLocked

COMMANDS = {
    "revoke": "revoke an agent's token: its connection is closed, the next REGISTER of its id "
    "gets a new token (its capabilities and held messages stay)",
    "remove": "remove an agent: its token, capabilities and held messages are gone",
}


class AdminFailed(Exception):
    """The command could not be carried out, for a reason one line tells."""


def add_commands(commands: argparse._SubParsersAction[Any]) -> None:
    """Add `revoke` and `remove` to the `lobby` command line."""
    data_dir = Path(os.environ.get("LOBBY_DATA_DIR") or ".lobby")
    for name, help_text in COMMANDS.items():
        command = commands.add_parser(name, help=help_text, description=help_text + ".")
        command.add_argument("agent_id")
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


def run(args: argparse.Namespace) -> str:
    """Carry out `args.command` for `args.agent_id`; the line to print. Raises `AdminFailed`."""
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
                return _offline(store, args.agent_id, remove=remove)
            finally:
                store.close()
    answer = _ask(args.url or _default_url(), _token(args), args.command, args.agent_id)
    done = "removed agent" if remove else "revoked the token of agent"
    online = "; its connection was closed" if answer.get("was_online") else ""
    return f"{done} {args.agent_id!r}{online}"


def _offline(store: SqliteStore, agent_id: str, *, remove: bool) -> str:
    saved = store.agent(agent_id)
    if saved is None:
        raise AdminFailed(f"no agent {agent_id!r} is registered in this store (see lobby agents)")
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


def _ask(url: str, token: str, command: str, agent_id: str) -> dict[str, object]:
    headers = {"Authorization": f"Bearer {token}"}
    try:
        with connect(url, additional_headers=headers, open_timeout=10, close_timeout=2) as ws:
            ws.send(orjson.dumps({"command": command, "agent_id": agent_id}).decode())
            answer: dict[str, object] = orjson.loads(ws.recv(timeout=30))
    except InvalidStatus as refused:
        status = refused.response.status_code
        if status == 401:
            raise AdminFailed(f"the lobby at {url} refused the admin token (401)") from None
        raise AdminFailed(f"the lobby at {url} answered HTTP {status}, not /admin") from None
    except (OSError, TimeoutError, WebSocketException) as exc:
        raise AdminFailed(f"cannot reach the lobby's admin endpoint at {url}: {exc}") from None
    if not answer.get("ok"):
        raise AdminFailed(str(answer.get("error")))
    return answer


__all__ = ["COMMANDS", "AdminFailed", "add_commands", "run"]
