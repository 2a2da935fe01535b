"""`lobby backup`: a copy taken from a running lobby under load restores every agent and every
message the lobby had ACCEPTED; what it cannot do is one line and leaves DEST as it was."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import pytest
from websockets.asyncio.client import ClientConnection, connect

from lobby.backup import backup
from lobby.store.sqlite import FILE_NAME
from tests.conftest import LobbyProcess, start_lobby_process
from tests.waiting import BOUND, until
from tests.wsclient import frame

WINDOW = 64
"""Messages a sender keeps in flight before it waits for an ACCEPTED."""

ACK_EVERY = 20
"""A receiver acknowledges after this many messages, as an SDK agent does now and then."""

MAILBOX_LIMIT = "1000000"
"""The offline receiver is sent messages for as long as the test runs: more than the
default 10,000 on a slow machine."""


async def join(url: str, agent_id: str, token: str | None = None) -> tuple[ClientConnection, str]:
    """REGISTER `agent_id` (with `acks`), or resume it with `token`; the connection and token."""
    ws = await connect(url)
    await ws.send(frame(agent_id, "REGISTER", {"acks": True}, auth_token=token))
    ack = orjson.loads(await asyncio.wait_for(ws.recv(), BOUND))
    expected = "success_registered_finalized" if token is None else "success_resumed"
    assert ack["message_type"] == "REGISTER_ACK", ack
    assert ack["payload"]["status"] == expected, ack
    return ws, str(ack["payload"]["auth_token"])


@dataclass
class Sender:
    """Sends TEXT messages round-robin to its receivers, at most WINDOW unconfirmed; counts
    how many of them (in sending order) an ACCEPTED has covered."""

    ws: ClientConnection
    agent_id: str
    token: str
    receivers: list[str]
    sent: list[tuple[str, str]] = field(default_factory=list)  # (message_id, receiver)
    accepted: int = 0
    refused: list[dict[str, Any]] = field(default_factory=list)
    _progress: asyncio.Event = field(default_factory=asyncio.Event)

    def accepted_for(self, receiver: str, upto: int) -> set[str]:
        """The ids of messages to `receiver` among the first `upto` sent."""
        return {mid for mid, to in self.sent[:upto] if to == receiver}

    async def run(self, stop: asyncio.Event) -> None:
        reader = asyncio.create_task(self._read())
        n = 0
        while not stop.is_set():
            assert not self.refused, self.refused[0]
            if len(self.sent) - self.accepted >= WINDOW:
                self._progress.clear()
                await asyncio.wait_for(self._progress.wait(), BOUND)
                continue
            receiver = self.receivers[n % len(self.receivers)]
            message_id = f"{self.agent_id}-{n}"
            self.sent.append((message_id, receiver))
            await self.ws.send(
                frame(
                    self.agent_id,
                    "TEXT",
                    {"content": f"message {n}"},
                    receiver_id=receiver,
                    message_id=message_id,
                    auth_token=self.token,
                )
            )
            n += 1
        await until(lambda: self.accepted == len(self.sent) or self.refused, "ACCEPTED")
        reader.cancel()
        assert not self.refused, self.refused[0]

    async def _read(self) -> None:
        position: dict[str, int] = {}
        async for raw in self.ws:
            message = orjson.loads(raw)
            if message["message_type"] != "ACCEPTED":
                self.refused.append(message)  # run() fails the test with it
                self._progress.set()
                continue
            covered = message["payload"]["message_id"]
            for i in range(len(position), len(self.sent)):
                position[self.sent[i][0]] = i
            self.accepted = max(self.accepted, position[covered] + 1)
            self._progress.set()


@dataclass
class Receiver:
    """Reads TEXT messages and acknowledges every ACK_EVERY of them."""

    ws: ClientConnection
    agent_id: str
    token: str
    seen: set[str] = field(default_factory=set)

    async def run(self) -> None:
        async for raw in self.ws:
            message = orjson.loads(raw)
            if message["message_type"] != "TEXT":
                continue
            self.seen.add(message["message_id"])
            if len(self.seen) % ACK_EVERY == 0:
                await self.ws.send(
                    frame(self.agent_id, "ACK", {"up_to": message["seq"]}, auth_token=self.token)
                )


@dataclass
class Before:
    """What a backup must hold: per receiver, the messages ACCEPTED before the backup
    started and those the receiver had read by the time it ended (it may have acknowledged
    them, so they need not be held)."""

    accepted: dict[str, set[str]]
    seen_by_end: dict[str, set[str]]


@dataclass
class Traffic:
    senders: list[Sender]
    receivers: list[Receiver]
    tokens: dict[str, str]  # every agent registered, with its token
    away: str  # a receiver that stays offline: all it is sent is held

    def accepted_now(self) -> dict[str, set[str]]:
        marks = [(sender, sender.accepted) for sender in self.senders]
        return {
            receiver: set().union(*(s.accepted_for(receiver, upto) for s, upto in marks))
            for receiver in self.receiver_ids
        }

    def seen_now(self) -> dict[str, set[str]]:
        return {r.agent_id: set(r.seen) for r in self.receivers} | {self.away: set()}

    @property
    def receiver_ids(self) -> list[str]:
        return [r.agent_id for r in self.receivers] + [self.away]

    def total_accepted(self) -> int:
        return sum(sender.accepted for sender in self.senders)


async def start_traffic(url: str, pairs: int) -> Traffic:
    tokens: dict[str, str] = {}
    ws, tokens["away"] = await join(url, "away")
    await ws.close()
    receivers = []
    for i in range(pairs):
        ws, token = await join(url, f"receiver-{i}")
        receivers.append(Receiver(ws, f"receiver-{i}", token))
        tokens[f"receiver-{i}"] = token
    senders = []
    for i in range(pairs):
        ws, token = await join(url, f"sender-{i}")
        senders.append(Sender(ws, f"sender-{i}", token, [f"receiver-{i}", "away"]))
        tokens[f"sender-{i}"] = token
    return Traffic(senders, receivers, tokens, "away")


async def check_restored(
    backup_file: Path, data_dir: Path, traffic: Traffic, before: Before
) -> None:
    """Start a lobby on a data dir made from `backup_file`: every agent resumes with its
    token, and each receiver gets, held for it, every message ACCEPTED before the backup that
    it had not read, in seq order with no gap up to a marker sent after the restore."""
    restore(backup_file, data_dir)
    lobby = start_lobby_process(data_dir, "--mailbox-limit", MAILBOX_LIMIT)
    try:
        receivers = {}
        for agent_id in traffic.receiver_ids:
            receivers[agent_id], _ = await join(lobby.url, agent_id, traffic.tokens[agent_id])
        for sender in traffic.senders:
            ws, _ = await join(lobby.url, sender.agent_id, traffic.tokens[sender.agent_id])
            for receiver in sender.receivers:
                await ws.send(
                    frame(
                        sender.agent_id,
                        "TEXT",
                        {"content": "after the restore"},
                        receiver_id=receiver,
                        message_id=f"{sender.agent_id}-marker-{receiver}",
                        auth_token=sender.token,
                    )
                )
        for agent_id, ws in receivers.items():
            markers = {
                f"{s.agent_id}-marker-{agent_id}"
                for s in traffic.senders
                if agent_id in s.receivers
            }
            held: list[str] = []
            seqs: list[int] = []
            while markers:
                message = orjson.loads(await asyncio.wait_for(ws.recv(), BOUND))
                if message["message_type"] == "TEXT":
                    markers.discard(message["message_id"])
                    held.append(message["message_id"])
                    seqs.append(message["seq"])
            assert seqs == list(range(seqs[0], seqs[0] + len(seqs))), agent_id
            missing = before.accepted[agent_id] - before.seen_by_end[agent_id] - set(held)
            assert not missing, f"{agent_id}: {len(missing)} ACCEPTED messages lost"
            assert before.accepted[agent_id], agent_id  # the check was not vacuous
            await ws.close()
    finally:
        stop(lobby)


def restore(backup_file: Path, data_dir: Path) -> None:
    """As docs/deploy.md says: the backup becomes the data dir's store."""
    data_dir.mkdir()
    shutil.copyfile(backup_file, data_dir / FILE_NAME)


def stop(lobby: LobbyProcess) -> None:
    if lobby.process.poll() is None:
        lobby.signal(signal.SIGTERM)
        lobby.wait(BOUND)


async def test_a_backup_under_load_restores_every_agent_and_accepted_message(
    tmp_path: Path,
) -> None:
    data = tmp_path / "data"
    lobby = start_lobby_process(data, "--mailbox-limit", MAILBOX_LIMIT)
    stopping = asyncio.Event()
    try:
        traffic = await start_traffic(lobby.url, pairs=3)
        readers = [asyncio.create_task(r.run()) for r in traffic.receivers]
        sending = [asyncio.create_task(s.run(stopping)) for s in traffic.senders]
        await until(lambda: traffic.total_accepted() >= 600, "traffic")

        # As an operator takes it: the command, beside the running lobby (which holds the
        # data dir's lock), while messages flow.
        accepted = traffic.accepted_now()
        process = await asyncio.create_subprocess_exec(
            *(sys.executable, "-m", "lobby", "backup", str(tmp_path / "by-command.sqlite3")),
            *("--data-dir", str(data)),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await asyncio.wait_for(process.communicate(), BOUND)
        assert process.returncode == 0, err
        assert out.decode().startswith(f"lobby: backed up {data / FILE_NAME} to "), out
        by_command = Before(accepted, traffic.seen_now())

        # One page a step, and the lobby made to commit between the steps: the copy is
        # still the store as it was when the copy began.
        accepted = traffic.accepted_now()
        steps: list[int] = []

        def wait_for_commits(remaining: int, total: int) -> None:
            if not steps:
                target = traffic.total_accepted() + 100
                deadline = time.monotonic() + BOUND
                while traffic.total_accepted() < target:
                    assert time.monotonic() < deadline, "no commits during the backup"
                    time.sleep(0.01)
            steps.append(remaining)

        pages = await asyncio.to_thread(
            backup,
            data,
            tmp_path / "by-steps.sqlite3",
            pages_per_step=1,
            pause=0,
            progress=wait_for_commits,
        )
        by_steps = Before(accepted, traffic.seen_now())
        assert len(steps) == pages > 1

        stopping.set()
        await asyncio.gather(*sending)
        for reader in readers:
            reader.cancel()
        for ws in [p.ws for p in traffic.senders] + [p.ws for p in traffic.receivers]:
            await ws.close()
    finally:
        stopping.set()
        stop(lobby)

    await check_restored(tmp_path / "by-command.sqlite3", tmp_path / "r1", traffic, by_command)
    await check_restored(tmp_path / "by-steps.sqlite3", tmp_path / "r2", traffic, by_steps)


def lobby_backup(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "lobby", "backup", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=BOUND,
    )


def one_line(done: subprocess.CompletedProcess[str]) -> str:
    assert "Traceback" not in done.stderr, done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("lobby: "), lines[0]
    return lines[0]


@pytest.fixture
def stopped_store(tmp_path: Path) -> Path:
    """A data dir a lobby has run on and stopped, holding one agent."""
    data = tmp_path / "data"
    lobby = start_lobby_process(data)
    try:
        asyncio.run(_register_one(lobby.url))
    finally:
        stop(lobby)
    return data


async def _register_one(url: str) -> None:
    ws, _ = await join(url, "kept")
    await ws.close()


def agent_ids(store: Path) -> list[str]:
    with contextlib.closing(sqlite3.connect(store)) as db:
        return [row[0] for row in db.execute("SELECT agent_id FROM agents")]


def test_a_stopped_lobby_is_backed_up_and_dest_is_replaced_only_with_force(
    stopped_store: Path, tmp_path: Path
) -> None:
    (tmp_path / "dest").write_text("precious")
    refused = lobby_backup("dest", "--data-dir", "data", cwd=tmp_path)
    assert refused.returncode == 2
    assert one_line(refused) == "lobby: dest exists: give --force to replace it"
    assert (tmp_path / "dest").read_text() == "precious"

    done = lobby_backup("dest", "--data-dir", "data", "--force", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert agent_ids(tmp_path / "dest") == ["kept"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data", "dest"]  # no part left


@pytest.mark.parametrize(
    ("args", "status", "line"),
    [
        (["out", "--data-dir", "nowhere"], 1, "lobby: no lobby store at nowhere/lobby.sqlite3"),
        (["a_file/out", "--data-dir", "data"], 2, "lobby: cannot write a_file/out: a_file is not"),
        (["no_dir/out", "--data-dir", "data"], 2, "lobby: cannot write no_dir/out: no_dir does"),
        (["data", "--data-dir", "data"], 2, "lobby: data is a directory: give a file name"),
        (
            ["broken/lobby.sqlite3", "--data-dir", "broken", "--force"],
            2,
            "lobby: broken/lobby.sqlite3 is the store itself",
        ),
        (["out", "--data-dir", "broken"], 1, "lobby: cannot copy the store broken/lobby.sqlite3"),
    ],
)
def test_a_backup_that_cannot_be_made_is_one_line_and_writes_nothing(
    tmp_path: Path, args: list[str], status: int, line: str
) -> None:
    (tmp_path / "data").mkdir()
    (tmp_path / "a_file").write_text("")
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / FILE_NAME).write_bytes(b"not a database" * 100)
    before = sorted(tmp_path.iterdir())
    done = lobby_backup(*args, cwd=tmp_path)
    assert done.returncode == status
    assert one_line(done).startswith(line)
    assert sorted(tmp_path.iterdir()) == before  # no DEST, no half-written part
