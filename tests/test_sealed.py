"""Sealed-bid CFP rounds over real sockets: held bids revealed at once in the recorded shuffled
order, a late bid refused, and a round that survives a kill -9 of a real `lobby serve`."""

from __future__ import annotations

import asyncio
import signal
import sqlite3
from contextlib import AsyncExitStack, closing
from pathlib import Path
from typing import Any

import orjson
from websockets.asyncio.client import ClientConnection, connect

from lobby.server import LobbyServer
from lobby.store.sqlite import FILE_NAME
from protocol.fipa import reveal_order
from tests.conftest import start_lobby_process
from tests.waiting import until
from tests.wsclient import frame, reply, token_of


class Raw:
    """One raw agent: a connection, its token, and what it has been sent."""

    def __init__(self, ws: ClientConnection, agent_id: str, token: str) -> None:
        self.ws, self.agent_id, self.token = ws, agent_id, token

    async def send(self, receiver: str, kind: str, payload: dict[str, Any], **extra: Any) -> None:
        await self.ws.send(
            frame(
                self.agent_id,
                kind,
                payload,
                receiver_id=receiver,
                auth_token=self.token,
                **extra,
            )
        )

    async def next(self, *kinds: str) -> dict[str, Any]:
        """The next message of one of `kinds` (ACCEPTED confirmations in between skipped)."""
        while True:
            message = await reply(self.ws)
            if message["message_type"] in kinds:
                return message
            assert message["message_type"] == "ACCEPTED", message


async def join(stack: AsyncExitStack, url: str, agent_id: str, **payload: Any) -> Raw:
    ws = await stack.enter_async_context(connect(url))
    return Raw(ws, agent_id, await token_of(ws, agent_id, **payload))


async def propose(bidder: Raw, cfp: dict[str, Any], price: int) -> None:
    await bidder.send(
        cfp["sender_id"],
        "PROPOSE",
        {"proposal": {"price": price, "goods": "apples"}},
        conversation_id=cfp["conversation_id"],
        in_reply_to=cfp["message_id"],
        message_id=f"bid-{bidder.agent_id}",
    )


async def test_ten_staggered_bids_reach_the_buyer_at_once_in_the_seeded_order(
    lobby: LobbyServer,
) -> None:
    async with AsyncExitStack() as stack:
        buyer = await join(stack, lobby.url, "buyer")
        bidders = [await join(stack, lobby.url, f"bidder-{i}", acks=True) for i in range(10)]
        names = [b.agent_id for b in bidders]
        await buyer.send(
            "global_lobby",
            "CFP",
            {"query": {"goods": "apples"}, "receivers": names, "sealed": {"reply_by": 60}},
            conversation_id="round-1",
        )
        cfps = [await b.next("CFP") for b in bidders]
        assert {c["conversation_id"] for c in cfps} == {f"round-1:{n}" for n in names}
        # Each bidder answers only once the one before it was durably accepted: staggered
        # arrivals, driven by the lobby's own confirmations.
        turns = [asyncio.Event() for _ in bidders]
        turns[0].set()

        async def bid(i: int) -> None:
            await turns[i].wait()
            await propose(bidders[i], cfps[i], 100 - i)
            accepted = await reply(bidders[i].ws)
            assert accepted["message_type"] == "ACCEPTED"
            assert accepted["payload"]["message_id"] == f"bid-{bidders[i].agent_id}"
            if i + 1 < len(turns):
                turns[i + 1].set()

        await asyncio.gather(*(bid(i) for i in range(10)))
        # The buyer's first message since its CFP: every bid, together. A PROPOSE forwarded
        # early would have come before it.
        revealed = await buyer.next("BIDS_REVEALED", "PROPOSE")
        assert revealed["message_type"] == "BIDS_REVEALED"
        payload = revealed["payload"]
        order = [b["sender_id"] for b in payload["bids"]]
        assert sorted(order) == sorted(names)
        assert order == reveal_order(payload["seed"], names)
        assert order != names  # arrival order (1 chance in 10! to coincide)
        assert {b["proposal"]["price"] for b in payload["bids"]} == set(range(91, 101))
        assert payload["declined"] == payload["unanswered"] == []
        # The buyer answers one bid as in any dialogue.
        best = min(payload["bids"], key=lambda b: b["proposal"]["price"])
        winner = bidders[names.index(best["sender_id"])]
        await buyer.send(
            best["sender_id"],
            "ACCEPT",
            {},
            conversation_id=best["dialogue_id"],
            in_reply_to=best["message_id"],
        )
        assert (await winner.next("ACCEPT"))["in_reply_to"] == best["message_id"]


async def test_the_deadline_reveals_what_came_and_a_late_bid_is_refused(
    lobby: LobbyServer,
) -> None:
    async with AsyncExitStack() as stack:
        buyer = await join(stack, lobby.url, "buyer")
        on_time = await join(stack, lobby.url, "on-time")
        late = await join(stack, lobby.url, "late")
        await buyer.send(
            "global_lobby",
            "CFP",
            {"query": {}, "receivers": ["on-time", "late"], "sealed": {"reply_by": 0.5}},
            conversation_id="round-2",
        )
        await propose(on_time, await on_time.next("CFP"), 10)
        cfp = await late.next("CFP")
        revealed = await buyer.next("BIDS_REVEALED", "PROPOSE")  # at the deadline
        assert [b["sender_id"] for b in revealed["payload"]["bids"]] == ["on-time"]
        assert revealed["payload"]["unanswered"] == ["late"]
        expired = await late.next("DIALOGUE_EXPIRED")
        assert expired["conversation_id"] == "round-2:late"
        await propose(late, cfp, 1)
        error = await late.next("ERROR")
        assert error["payload"]["code"] == "invalid_dialogue"
        assert "sealed_reply_by_passed" in error["payload"]["error"]
        assert "reply_by deadline" in error["payload"]["error"]


async def test_before_the_reveal_no_probe_tells_who_has_answered(lobby: LobbyServer) -> None:
    """An outsider, a competing seller (silent) and the buyer each send every move into the
    dialogues of a seller that bid, one that declined and one still silent: the ERRORs are
    the same but for the seller's name."""
    names = ("bid", "declined", "silent")
    async with AsyncExitStack() as stack:
        buyer = await join(stack, lobby.url, "buyer")
        sellers = {n: await join(stack, lobby.url, n, acks=True) for n in (*names, "rival")}
        outsider = await join(stack, lobby.url, "outsider")
        round_ = {"query": {}, "receivers": list(sellers), "sealed": {"reply_by": 60}}
        await buyer.send("global_lobby", "CFP", round_, conversation_id="r1", message_id="c1")
        for name, kind, payload in (
            ("bid", "PROPOSE", {"proposal": {"price": 5}}),
            ("declined", "DECLINE", {"reason": "sold out"}),
        ):
            seller = sellers[name]
            await seller.next("CFP")
            await seller.send(
                "buyer", kind, payload, conversation_id=f"r1:{name}", in_reply_to="c1"
            )
            assert (await reply(seller.ws))["message_type"] == "ACCEPTED"  # held, not sent
        await sellers["rival"].next("CFP")
        probers = (outsider, sellers["rival"], buyer)
        moves: dict[str, dict[str, Any]] = {
            "CFP": {"query": {}},
            "PROPOSE": {"proposal": {"price": 1}},
            "ACCEPT": {},
            "DECLINE": {},
            "MATCH_ACCEPT": {},
        }
        answers: dict[str, list[dict[str, Any]]] = {}
        for name in names:
            answers[name] = []
            for prober in probers:
                for kind, body in moves.items():
                    await prober.send(
                        name,
                        kind,
                        body,
                        conversation_id=f"r1:{name}",
                        in_reply_to=None if kind == "CFP" else "c1",
                        message_id=f"probe-{kind}",
                    )
                    error = await prober.next("ERROR", "BIDS_REVEALED", "PROPOSE", "DECLINE")
                    del error["message_id"]  # the lobby's own numbering
                    answers[name].append(
                        orjson.loads(orjson.dumps(error).replace(name.encode(), b"T"))
                    )
        assert answers["bid"] == answers["declined"] == answers["silent"]
        rules = {a["payload"]["error"].rsplit("(rule: ", 1)[1] for a in answers["bid"]}
        assert rules == {"not_a_party)", "round_not_revealed)"}


async def test_a_sealed_round_survives_kill_9_with_its_bids_and_deadline(tmp_path: Path) -> None:
    data = tmp_path / "data"
    proc = start_lobby_process(data)
    try:
        async with AsyncExitStack() as stack:
            buyer = await join(stack, proc.url, "buyer", acks=True)
            bidders = [await join(stack, proc.url, f"b{i}", acks=True) for i in range(3)]
            tokens = {a.agent_id: a.token for a in (buyer, *bidders)}
            await buyer.send(
                "global_lobby",
                "CFP",
                {"query": {}, "receivers": ["b0", "b1", "b2"], "sealed": {"reply_by": 600}},
                conversation_id="round-3",
                message_id="cfp-3",
            )
            assert (await reply(buyer.ws))["message_type"] == "ACCEPTED"
            cfps = [await b.next("CFP") for b in bidders]
            for bidder, cfp in zip(bidders[:2], cfps, strict=False):
                await propose(bidder, cfp, 5)
                assert (await reply(bidder.ws))["message_type"] == "ACCEPTED"  # durable
        saved = _saved_round(data)
        proc.signal(signal.SIGKILL)
        proc.wait(10)
        proc = start_lobby_process(data, port=proc.port)
        async with AsyncExitStack() as stack:
            resumed = {}
            for agent_id, token in tokens.items():
                ws = await stack.enter_async_context(connect(proc.url))
                await ws.send(frame(agent_id, "REGISTER", {"acks": True}, auth_token=token))
                assert (await reply(ws))["payload"]["status"] == "success_resumed"
                resumed[agent_id] = Raw(ws, agent_id, token)
            # The held bids were not lost: the last bid completes the round.
            await propose(resumed["b2"], cfps[2], 4)
            revealed = await resumed["buyer"].next("BIDS_REVEALED", "PROPOSE")
            payload = revealed["payload"]
            assert [b["sender_id"] for b in payload["bids"]] == reveal_order(
                saved["seed"], ["b0", "b1", "b2"]
            )
            assert (payload["seed"], payload["reply_by"]) == (saved["seed"], saved["reply_by"])
            # The reveal reaches the store with the group commit after it was sent.
            await until(lambda: _saved_round(data)["revealed_at"] is not None, "reveal stored")
    finally:
        if proc.process.poll() is None:
            proc.signal(signal.SIGTERM)
            proc.wait(10)


def _saved_round(data: Path) -> dict[str, Any]:
    """The round as the store holds it: its seed and deadline are on record."""
    with closing(sqlite3.connect(data / FILE_NAME)) as db:
        (document,) = db.execute(
            "SELECT data FROM state WHERE kind = 'sealed_round' AND key = 'round-3'"
        ).fetchone()
    saved: dict[str, Any] = orjson.loads(document)
    return saved
