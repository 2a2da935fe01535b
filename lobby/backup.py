"""`lobby backup DEST`: a consistent copy of a lobby's SQLite store, taken while it runs or not.

The copy uses SQLite's online backup API from one read transaction: the whole copy is the store
as it was at one instant (every batch committed before it, nothing half written), however many
commits the running lobby makes meanwhile. WAL lets that reader and the lobby's writer go on
side by side; the lobby's checkpoints stop at the reader's snapshot until the copy ends, so the
WAL file grows by what is committed meanwhile and shrinks again at the next checkpoint. Pages
are copied a step at a time with a short pause between steps, so the copy's disk reads leave
room for the lobby's commits.

The copy is written to a temporary file beside DEST, checked (`PRAGMA quick_check`), synced
and renamed into place: DEST is either the previous file or a whole backup, never half of one.
It only reads the data dir: it never takes the lobby's lock file (`lobby.lock`), so it works
beside a running lobby.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sqlite3
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from lobby.store.sqlite import FILE_NAME

PAGES_PER_STEP = 256
"""Pages copied between two pauses: 1 MiB at SQLite's default 4 KiB page."""

PAUSE = 0.005
"""Seconds between two steps (a 1 GiB store takes about 5 s of pauses)."""

Parser = TypeVar("Parser", bound=argparse.ArgumentParser)

Progress = Callable[[int, int], None]
"""Called after each step with (pages remaining, pages in all)."""


class BackupError(Exception):
    """The backup could not be made; `str()` is one line naming the cause. `status` is the
    command's exit status: 2 for a DEST that cannot be used, 1 for a store that cannot be read
    or copied."""

    def __init__(self, message: str, *, status: int) -> None:
        super().__init__(message)
        self.status = status


def add_command(commands: argparse._SubParsersAction[Parser]) -> None:
    """Register `lobby backup` (call once while building the `lobby` parser)."""
    parser = commands.add_parser(
        "backup",
        help="copy the store to a file, even while the lobby runs",
        description="Copy the lobby's SQLite store to DEST, consistently, while it runs or "
        "not. Restore: stop the lobby, delete lobby.sqlite3-wal and lobby.sqlite3-shm in the "
        "data dir, copy DEST to DATA_DIR/lobby.sqlite3, start it (docs/deploy.md).",
    )
    parser.add_argument("dest", type=Path, metavar="DEST", help="the file to write")
    parser.add_argument(
        "--data-dir",
        type=Path,
        default=Path(os.environ.get("LOBBY_DATA_DIR") or ".lobby"),
        help="the lobby's data dir (default: %(default)s, from LOBBY_DATA_DIR when set)",
    )
    parser.add_argument("--force", action="store_true", help="replace DEST if it exists")


def run(args: argparse.Namespace) -> int:
    """`lobby backup` as parsed: one line on stdout when done, on stderr when not."""
    try:
        pages = backup(args.data_dir, args.dest, force=args.force)
    except BackupError as failed:
        sys.stderr.write(f"lobby: {failed}\n")
        return failed.status
    sys.stdout.write(
        f"lobby: backed up {args.data_dir / FILE_NAME} to {args.dest} ({pages} pages)\n"
    )
    return 0


def backup(
    data_dir: Path,
    dest: Path,
    *,
    force: bool = False,
    pages_per_step: int = PAGES_PER_STEP,
    pause: float = PAUSE,
    progress: Progress | None = None,
) -> int:
    """Copy the store in `data_dir` to `dest`; the number of pages copied. Raises
    `BackupError`, leaving `dest` as it was."""
    source = data_dir / FILE_NAME
    _check_dest(dest, source, force=force)
    if not source.is_file():
        raise BackupError(f"no lobby store at {source} (is --data-dir right?)", status=1)
    try:
        fd, name = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".part", dir=dest.parent)
    except OSError as exc:
        raise BackupError(f"cannot write {dest}: {exc.strerror or exc}", status=2) from None
    os.close(fd)
    part = Path(name)
    try:
        copied = _copy(source, part, pages_per_step, pause, progress)
        _sync(part)
        os.replace(part, dest)
        _sync(dest.parent)  # the rename itself
    except sqlite3.Error as exc:
        raise BackupError(f"cannot copy the store {source}: {exc}", status=1) from None
    except OSError as exc:
        raise BackupError(f"cannot write {dest}: {exc.strerror or exc}", status=1) from None
    finally:
        part.unlink(missing_ok=True)
    return copied


def _check_dest(dest: Path, source: Path, *, force: bool) -> None:
    store_files = {source.resolve()} | {
        source.with_name(source.name + end).resolve() for end in ("-wal", "-shm")
    }
    if dest.resolve() in store_files:  # --force would put a copy under the running lobby
        raise BackupError(f"{dest} is the store itself: back it up elsewhere", status=2)
    if dest.is_dir():
        raise BackupError(f"{dest} is a directory: give a file name", status=2)
    if dest.exists() and not force:
        raise BackupError(f"{dest} exists: give --force to replace it", status=2)
    if not dest.parent.exists():
        raise BackupError(f"cannot write {dest}: {dest.parent} does not exist", status=2)
    if not dest.parent.is_dir():
        raise BackupError(f"cannot write {dest}: {dest.parent} is not a directory", status=2)


def _copy(
    source: Path, part: Path, pages_per_step: int, pause: float, progress: Progress | None
) -> int:
    """The online backup of `source` into `part`, from one read transaction (a snapshot)."""
    total = 0

    def step(status: int, remaining: int, pages: int) -> None:
        nonlocal total
        total = pages
        if progress is not None:
            progress(remaining, pages)
        if remaining:
            time.sleep(pause)

    with contextlib.closing(_open_readonly(source)) as db:
        # Without a read transaction held across the steps, each commit of the running
        # lobby would restart the copy from its first page (and under load it never ends).
        db.execute("BEGIN")
        db.execute("SELECT count(*) FROM sqlite_master").fetchone()
        with contextlib.closing(sqlite3.connect(part, isolation_level=None)) as copy:
            db.backup(copy, pages=pages_per_step, progress=step)
            # The copy is of a WAL store; as a rollback-journal file it is one self-contained
            # file (opening it leaves no -wal beside it). The lobby turns WAL on again.
            copy.execute("PRAGMA journal_mode=DELETE")
            (check,) = copy.execute("PRAGMA quick_check").fetchone()
            if check != "ok":
                raise sqlite3.DatabaseError(f"the copy fails its check: {check}")
        db.execute("ROLLBACK")
    return total


def _open_readonly(source: Path) -> sqlite3.Connection:
    uri = source.absolute().as_uri() + "?mode=ro"  # as_uri quotes a '?' or '#' in the path
    return sqlite3.connect(uri, uri=True, isolation_level=None)


def _sync(path: Path) -> None:
    """fsync a file or a directory, so the backup is on disk when the command says so."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
