"""Nothing lost: the sqlite store across SIGKILL and SIGTERM of a real lobby process."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import orjson
from websockets.asyncio.client import connect

from agent_sdk import Agent, Message, MessageType, RequestContext, capability
from lobby.store.sqlite import FILE_NAME
from tests.conftest import LobbyProcess, start_lobby_process
from tests.waiting import until


class Collector(Agent):
    """Records, in arrival order, the `n` of every `collect` REQUEST it serves."""

    agent_id = "collector"

    def __init__(self, url: str | list[str], **kwargs: Any) -> None:
        super().__init__(lobby_url=url, reconnect_max_delay=0.3, max_concurrency=1, **kwargs)
        self.seen: list[int] = []

    @capability("collect", description="Records n.")
    async def collect(self, request: dict[str, Any], ctx: RequestContext) -> None:
        self.seen.append(int(request["n"]))


async def send_numbers(
    sender: Agent, numbers: range, *, pause: float = 0.0, to: str = "collector"
) -> None:
    for n in numbers:
        await sender.send(
            to,
            MessageType.REQUEST,
            {"capability_name": "collect", "n": n},
            conversation_id=str(uuid.uuid4()),
        )
        if pause:
            await asyncio.sleep(pause)


def restart(proc: LobbyProcess, data_dir: Path, signum: int) -> LobbyProcess:
    proc.signal(signum)
    proc.wait(10)
    return start_lobby_process(data_dir, port=proc.port)


def stop(proc: LobbyProcess) -> None:
    if proc.process.poll() is None:
        proc.signal(signal.SIGTERM)
        proc.wait(10)


async def test_queued_messages_survive_kill_9_and_arrive_in_order_once(tmp_path: Path) -> None:
    data = tmp_path / "data"
    lobby = start_lobby_process(data)
    try:
        collector = Collector(lobby.url)
        async with collector:
            pass  # registered, then offline: the lobby holds what is sent to it
        sender = Agent("sender", lobby_url=lobby.url)
        async with sender:
            await send_numbers(sender, range(1000))
            await until(lambda: len(sender._dispatcher.outbound) == 0)  # every message ACCEPTED
        lobby = restart(lobby, data, signal.SIGKILL)
        async with collector, sender:
            await until(lambda: len(collector.seen) >= 1000)
            await send_numbers(sender, range(1000, 1001))  # arrives behind any repeat
            await until(lambda: 1000 in collector.seen)
        assert collector.seen == list(range(1001))
        assert collector.stats.resumes == 1  # the restarted lobby still knew its token
    finally:
        stop(lobby)


async def test_a_stream_sent_across_kill_9_loses_and_duplicates_nothing(tmp_path: Path) -> None:
    data = tmp_path / "data"
    lobby = start_lobby_process(data)
    try:
        collector = Collector(lobby.url)
        sender = Agent("sender", lobby_url=lobby.url, reconnect_max_delay=0.3)
        async with collector, sender:
            stream = asyncio.create_task(send_numbers(sender, range(300), pause=0.005))
            await until(lambda: len(collector.seen) >= 100)
            lobby = restart(lobby, data, signal.SIGKILL)
            await stream
            await until(lambda: len(sender._dispatcher.outbound) == 0)
            await send_numbers(sender, range(300, 301))  # arrives behind any repeat
            await until(lambda: 300 in collector.seen)
        assert sorted(collector.seen) == list(range(301))
        assert len(collector.seen) == 301
        assert sender.stats.reconnects == 1
    finally:
        stop(lobby)


async def test_an_acknowledged_message_is_never_redelivered(tmp_path: Path) -> None:
    data = tmp_path / "data"
    lobby = start_lobby_process(data)
    try:
        collector = Collector(lobby.url)
        async with collector, Agent("sender", lobby_url=lobby.url) as sender:
            await send_numbers(sender, range(20))
            await until(lambda: len(collector.seen) == 20)
        # A clean stop sends the last ACK before closing; SIGTERM commits it.
        lobby = restart(lobby, data, signal.SIGTERM)
        fresh = Collector(lobby.url)
        # The same agent, restarted with its saved token.
        fresh._sender.token = collector._sender.token
        async with fresh, Agent("sender", lobby_url=lobby.url) as sender:
            await send_numbers(sender, range(20, 21))  # arrives behind any redelivery
            await until(lambda: 20 in fresh.seen)
        assert fresh.stats.resumes == 1
        assert fresh.seen == [20]
    finally:
        stop(lobby)


async def register_raw(url: str, agent_id: str, **payload: Any) -> tuple[Any, str]:
    ws = await connect(url)
    frame = {
        "sender_id": agent_id,
        "receiver_id": "global_lobby",
        "message_type": "REGISTER",
        "payload": payload,
    }
    await ws.send(orjson.dumps(frame).decode())
    reply = orjson.loads(await ws.recv())
    return ws, reply["payload"]["auth_token"]


async def test_registrations_tokens_and_conversations_survive_a_restart(tmp_path: Path) -> None:
    data = tmp_path / "data"
    lobby = start_lobby_process(data)
    try:
        cap = {"name": "slow", "description": "", "input_schema": {}, "output_schema": {}}
        responder, responder_token = await register_raw(lobby.url, "responder", capabilities=[cap])
        requester, requester_token = await register_raw(lobby.url, "requester")
        request = {
            "sender_id": "requester",
            "receiver_id": "responder",
            "message_type": "REQUEST",
            "payload": {"capability_name": "slow"},
            "conversation_id": "conv-1",
            "auth_token": requester_token,
        }
        await requester.send(orjson.dumps(request).decode())
        delivered = orjson.loads(await asyncio.wait_for(responder.recv(), 5))
        assert delivered["conversation_id"] == "conv-1"
        await responder.close()
        await requester.close()

        lobby = restart(lobby, data, signal.SIGTERM)

        resumed = {
            "sender_id": "responder",
            "receiver_id": "global_lobby",
            "message_type": "REGISTER",
            "payload": {},
            "auth_token": responder_token,
        }
        async with connect(lobby.url) as responder_ws, connect(lobby.url) as requester_ws:
            await responder_ws.send(orjson.dumps(resumed).decode())
            ack = orjson.loads(await responder_ws.recv())
            assert ack["payload"] == {
                "status": "success_resumed",
                "lobby_id": "global_lobby",
                "auth_token": responder_token,
                # The identity made at the first start, kept across the restart.
                "lobby_identity": (data / "lobby.id").read_text().strip(),
            }
            resumed["sender_id"] = "requester"
            resumed["auth_token"] = requester_token
            await requester_ws.send(orjson.dumps(resumed).decode())
            assert orjson.loads(await requester_ws.recv())["payload"]["status"] == "success_resumed"
            response = {
                "sender_id": "responder",
                "receiver_id": "requester",
                "message_type": "RESPONSE",
                "payload": {"status": "success", "answer": 42},
                "conversation_id": "conv-1",
                "auth_token": responder_token,
            }
            await responder_ws.send(orjson.dumps(response).decode())
            forwarded = orjson.loads(await asyncio.wait_for(requester_ws.recv(), 5))
            assert forwarded["payload"] == {"status": "success", "answer": 42}
            assert "auth_token" not in forwarded
    finally:
        stop(lobby)
    stored = (data / FILE_NAME).read_bytes()
    for wal in data.glob(f"{FILE_NAME}-*"):
        stored += wal.read_bytes()
    assert responder_token.encode() not in stored
    assert requester_token.encode() not in stored


async def test_admin_commands_read_the_store(tmp_path: Path) -> None:
    data = tmp_path / "data"
    lobby = start_lobby_process(data)
    try:
        collector = Collector(lobby.url)
        async with collector:
            pass
        async with Agent("sender", lobby_url=lobby.url) as sender:
            await send_numbers(sender, range(3))
            await until(lambda: len(sender._dispatcher.outbound) == 0)
        agents = orjson.loads(admin_command("agents", "--data-dir", str(data), "--json"))
        by_id = {a["agent_id"]: a for a in agents}
        assert by_id["collector"] == {
            "agent_id": "collector",
            "capabilities": ["collect"],
            "acks": True,
            "held_messages": 3,
        }
        held = orjson.loads(
            admin_command("mailbox", "collector", "--data-dir", str(data), "--json")
        )
        assert [m["seq"] for m in held] == [1, 2, 3]
        assert {m["sender_id"] for m in held} == {"sender"}
        assert {m["message_type"] for m in held} == {"REQUEST"}
        table = admin_command("agents", "--data-dir", str(data))
        assert "collector" in table
        assert "held_messages" in table
    finally:
        stop(lobby)


def admin_command(*args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "lobby", *args],
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    )
    return done.stdout


async def test_a_dialogue_and_a_purchase_survive_a_restart_midway(tmp_path: Path) -> None:
    """The lobby restarts in the middle of a negotiation and between proposal and payment;
    both finish afterwards, and the ledger keeps what was recorded before."""
    data = tmp_path / "data"
    lobby = start_lobby_process(data)
    try:
        buyer = Agent("buyer", lobby_url=lobby.url, reconnect_max_delay=0.3)
        seller = Agent("seller", lobby_url=lobby.url, reconnect_max_delay=0.3)
        async with buyer, seller:
            dialogue = await buyer.cfp("seller", {"goods": {"apples": 3}})
            await until(lambda: seller.dialogue(dialogue.dialogue_id) is not None)
            theirs = seller.dialogue(dialogue.dialogue_id)
            assert theirs is not None
            await theirs.propose({"goods": {"apples": 3}, "price": 4.5})
            assert (await dialogue.next_move(5)).kind == "PROPOSE"
            order = await seller.propose_order(
                "buyer", [{"id": "a", "name": "apple", "price": "1.50", "quantity": 3}]
            )
            await until(lambda: len(seller._dispatcher.outbound) == 0)

            lobby = restart(lobby, data, signal.SIGKILL)
            await until(lambda: buyer.stats.resumes == 1 and seller.stats.resumes == 1)

            await dialogue.accept()  # the lobby still knows whose turn it is
            assert (await theirs.next_move(5)).kind == "ACCEPT"
            await theirs.match_accept()
            confirmed = await dialogue.next_move(5)
            while confirmed.kind != "TRANSACTION_CONFIRMED":
                confirmed = await dialogue.next_move(5)
            assert confirmed.payload["transaction"]["amount"] == "4.50"
            proposal = Message(
                "seller",
                "buyer",
                MessageType.ORDER_PROPOSAL,
                {"total_price": order.total_price},
                message_id=order.message_id,
            )
            receipt = await buyer.pay(proposal)
            assert receipt["amount"] == "4.50"
            await until(lambda: len(buyer._dispatcher.outbound) == 0)

        lobby = restart(lobby, data, signal.SIGTERM)
        async with Agent("auditor", lobby_url=lobby.url) as auditor:
            assert await auditor.list_transactions() == []
        kinds = sorted(
            t["kind"]
            for t in orjson.loads(admin_command("transactions", "--data-dir", str(data), "--json"))
        )
        assert kinds == ["negotiation", "payment"]
    finally:
        stop(lobby)
