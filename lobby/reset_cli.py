"""`lobby reset --data-dir D`: start a development lobby afresh, in one command.

It deletes the lobby's state in its data dir (the SQLite store, the admin token, the lobby's
identity) and the tokens the SDK saved on this machine for that lobby (keyed by its identity,
`agent_sdk.identity`), naming each path it deletes. Other files in the data dir are left, and
so is the data dir itself unless it is empty afterwards. It refuses while a lobby holds the
data dir (its lock), and `--dry-run` only names what it would delete. The next `lobby serve`
on that data dir is a new lobby, with a new identity: every agent registers afresh.
"""

from __future__ import annotations

import argparse
import errno
import fcntl
import os
import shutil
from pathlib import Path
from typing import Any

from lobby.admin_endpoint import TOKEN_FILE
from lobby.identity import IDENTITY_FILE, PATTERN
from lobby.store.sqlite import FILE_NAME, LOCK_NAME

HELP = "delete a stopped development lobby's state and the agent tokens saved for it"
STATE_FILES = (FILE_NAME, f"{FILE_NAME}-wal", f"{FILE_NAME}-shm", TOKEN_FILE, IDENTITY_FILE)


class ResetRefused(Exception):
    """Nothing was deleted, for a reason one line tells."""


def add_command(commands: argparse._SubParsersAction[Any]) -> None:
    command = commands.add_parser("reset", help=HELP, description=HELP + ".")
    command.add_argument(
        "--data-dir",
        type=Path,
        default=Path(os.environ.get("LOBBY_DATA_DIR") or ".lobby"),
        help="the lobby's data dir (%(default)s)",
    )
    command.add_argument(
        "--dry-run", action="store_true", help="name what would be deleted, delete nothing"
    )


def agent_state_dir() -> Path:
    """Where the SDK keeps its tokens, as `agent_sdk.identity.state_dir()` finds it (the
    lobby does not import the SDK): `$AGENT_LOBBY_STATE_DIR`, else the XDG state home's."""
    explicit = os.environ.get("AGENT_LOBBY_STATE_DIR")
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_STATE_HOME")
    base = Path(xdg) if xdg and os.path.isabs(xdg) else Path.home() / ".local" / "state"
    return base / "agent-lobby"


def run(args: argparse.Namespace) -> list[str]:
    """Reset `args.data_dir`: the lines to print. Raises `ResetRefused`."""
    data_dir: Path = args.data_dir
    present = [data_dir / name for name in STATE_FILES if (data_dir / name).exists()]
    if not present:
        raise ResetRefused(f"no lobby state in {data_dir} (is --data-dir right?)")
    lock = data_dir / LOCK_NAME
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # held while deleting: no lobby starts
        except BlockingIOError:
            holder = os.read(fd, 32).decode(errors="replace").strip() or "?"
            raise ResetRefused(
                f"a lobby (pid {holder}) is running on {data_dir}: stop it first; nothing "
                "was deleted"
            ) from None
        tokens = _tokens_dir(data_dir)
        doomed = present + ([tokens] if tokens is not None else [])
        verb = "would delete" if args.dry_run else "deleted"
        lines = [f"{verb} {path}" for path in doomed]
        if args.dry_run:
            return lines
        for path in doomed:
            if path.is_dir():
                shutil.rmtree(path)
            else:
                path.unlink()
        lock.unlink()
    finally:
        os.close(fd)
    try:
        data_dir.rmdir()
    except OSError as exc:
        if exc.errno != errno.ENOTEMPTY:
            raise
        lines.append(f"kept {data_dir}: it holds other files")
    return lines


def _tokens_dir(data_dir: Path) -> Path | None:
    """The SDK's saved tokens for the lobby whose identity `data_dir` keeps, if any."""
    try:
        identity = (data_dir / IDENTITY_FILE).read_text(encoding="ascii").strip()
    except (OSError, UnicodeDecodeError):
        return None
    if not PATTERN.fullmatch(identity):
        return None
    tokens = agent_state_dir() / "tokens" / identity
    return tokens if tokens.is_dir() else None


__all__ = ["HELP", "ResetRefused", "add_command", "agent_state_dir", "run"]
