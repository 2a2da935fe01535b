"""The lobby's identity: a random id that tells this lobby (its state) from any other one that
answers at the same address later.

Agents key their saved tokens by it (`agent_sdk.identity`), so a token issued by one lobby is
never offered to another. It is made once and kept with the lobby's state: in `DATA_DIR/lobby.id`
for the sqlite store (a new `--data-dir` is a new lobby), in the cluster's KV bucket `lobby`
for the nodes of a cluster (`lobby.cluster.node`), and made at each start for the memory
store, which forgets every agent when it stops. The lobby announces it in the WebSocket
handshake response (header `Agent-Lobby-Id`), in REGISTER_ACK (`lobby_identity`) and in
`/healthz`.
"""

from __future__ import annotations

import os
import re
import secrets
from pathlib import Path
from typing import Final

from lobby.store.base import StoreUnavailable
from lobby.transport.base import IDENTITY_HEADER as HEADER

IDENTITY_FILE: Final = "lobby.id"
PATTERN: Final = re.compile(r"[0-9a-z-]{8,64}")
"""What an identity looks like: never `_`, so a directory named after one is never the
`host_port` of a lobby that announces none."""


class IdentityUnreadable(StoreUnavailable):
    """`DATA_DIR/lobby.id` exists but holds no identity: `str()` says which file (`lobby
    serve` prints it as its one line)."""


def new_identity() -> str:
    """A fresh identity: 128 random bits in hex."""
    return secrets.token_hex(16)


def kept_identity(data_dir: Path) -> str:
    """The identity kept in `data_dir`, made and written (mode 0600) if there is none yet (or
    only the empty file a crash while writing it left). The caller holds the data dir's lock."""
    path = data_dir / IDENTITY_FILE
    try:
        kept = path.read_text(encoding="ascii", errors="replace").strip()
    except FileNotFoundError:
        kept = ""
    if PATTERN.fullmatch(kept):
        return kept
    if kept:
        raise IdentityUnreadable(
            f"{path} holds no lobby identity (32 hex digits): delete it, and the lobby starts "
            "under a new one (agents then register afresh)"
        )
    identity = new_identity()
    temporary = data_dir / f".{IDENTITY_FILE}.tmp"
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, f"{identity}\n".encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(temporary, path)
    return identity


__all__ = ["HEADER", "IDENTITY_FILE", "IdentityUnreadable", "kept_identity", "new_identity"]
