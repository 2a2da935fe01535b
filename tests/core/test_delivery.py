"""Delivery, synchronously through the Router and its clock: messages held for offline agents,
redelivery to acknowledging agents, full mailboxes, the dedupe horizon, ACKs and the lobby's
own notices (lobby/core/delivery.py)."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from structlog.testing import capture_logs

from lobby.core import Router
from lobby.core.records import (
    DELIVERED,
    Acked,
    AgentSaved,
    Effect,
    MessageStored,
    Record,
    Snapshot,
    StateSaved,
)
from lobby.core.session import NO_MAIL
from protocol.models import MessageType
from tests.routerkit import Clock, Peer, cap, frames, join, make_router, pair, raw, request, world

ERROR_KEYS = {"error", "code", "original_message_type", "original_conversation_id"}


def error_code(peer: Peer) -> str:
    error = peer.last()
    assert error["message_type"] == "ERROR"
    assert set(error["payload"]) == ERROR_KEYS
    return str(error["payload"]["code"])


def text(peer: Peer, to: str, content: str, message_id: str) -> None:
    peer.to(to, "TEXT", {"content": content}, message_id=message_id)


def contents(peer: Peer) -> list[tuple[str, str]]:
    return [(m["sender_id"], m["payload"]["content"]) for m in peer.take()]


HORIZON = 60.0


def resume(peer: Peer, **payload: Any) -> list[dict[str, Any]]:
    """`peer` comes back on a new connection with its token: what it is sent, ACK first."""
    router = peer.router
    session = router.open(peer.agent_id)
    frame = {
        "sender_id": peer.agent_id,
        "receiver_id": "global_lobby",
        "message_type": "REGISTER",
        "payload": payload,
        "auth_token": peer.token,
    }
    actions = router.handle(session, orjson.dumps(frame).decode())
    world.peers.pop(peer.session.id, None)
    peer.session = session
    world.peers[session.id] = peer
    world.deliver(actions)
    return peer.take()


def test_messages_for_an_offline_agent_are_held_and_delivered_in_order() -> None:
    router, alice, bob = pair()
    router.close(bob.session)
    for n in range(3):
        request(alice, conversation=f"k{n}", n=n)
    assert bob.take() == []
    session = router.open()
    held = frames(
        raw(router, session, sender_id="bob", message_type="REGISTER", auth_token=bob.token)
    )
    assert held[0]["payload"]["status"] == "success_resumed"
    assert [m["payload"]["n"] for m in held[1:]] == [0, 1, 2]


def test_agents_share_one_empty_mailbox_until_a_message_is_held_for_one() -> None:
    """An idle agent holds no deque of its own (about 600 bytes each); the first message held
    for it, or kept for its ACK, gives it one, and the shared one stays empty."""
    router = make_router()
    alice = join(router, "alice")
    bob = join(router, "bob", capabilities=[cap("c")], acks=True)
    carol = join(router, "carol", capabilities=[cap("c")])
    agents = router.registry.agents
    assert agents["alice"].mailbox is agents["bob"].mailbox is NO_MAIL
    request(alice, conversation="k0", to="bob", n=0)
    request(alice, conversation="k1", to="carol", n=1)
    assert [seq for seq, _ in agents["bob"].mailbox] == [1]  # kept for its ACK
    assert agents["carol"].mailbox is NO_MAIL  # written, nothing held
    bob.send("ACK", {"up_to": 1})
    assert len(agents["bob"].mailbox) == 0
    router.close(carol.session, 1000)  # offline: what comes now is held
    request(alice, conversation="k2", to="carol", n=2)
    assert [seq for seq, _ in agents["carol"].mailbox] == [2]
    assert len(NO_MAIL) == 0
    held = (1, b"{}")
    for name, args in (
        ("append", (held,)),
        ("appendleft", (held,)),
        ("extend", ([held],)),
        ("extendleft", ([held],)),
        ("insert", (0, held)),
        ("__iadd__", ([held],)),
    ):
        with pytest.raises(TypeError):
            getattr(NO_MAIL, name)(*args)
    assert len(NO_MAIL) == 0


def test_acknowledging_agents_get_unacknowledged_messages_again() -> None:
    router = make_router()
    alice = join(router, "alice")
    bob = join(router, "bob", capabilities=[cap("c")], acks=True)
    for n in range(3):
        request(alice, conversation=f"k{n}", n=n)
    first = bob.take()
    bob.send("ACK", {"up_to": first[0]["seq"]})
    session = router.open()
    again = frames(
        raw(
            router,
            session,
            sender_id="bob",
            message_type="REGISTER",
            auth_token=bob.token,
            payload={"acks": True},
        )
    )[1:]
    assert [m["payload"]["n"] for m in again] == [1, 2]
    assert all(m["redelivered"] is True for m in again)


@pytest.mark.parametrize("trace", [False, True])  # at DEBUG, `deliver` logs then does the same
def test_a_full_mailbox_refuses_the_sender(trace: bool) -> None:
    router = make_router(mailbox_limit=2, trace=trace)
    alice = join(router, "alice")
    bob = join(router, "bob", capabilities=[cap("c")])
    router.close(bob.session)
    request(alice, conversation="k1")
    request(alice, conversation="k2")
    request(alice, conversation="k3")
    assert alice.inbox[-1]["payload"]["error"] == "agent 'bob' already holds 2 undelivered messages"
    assert error_code(alice) == "mailbox_full"
    assert len(router.registry.agents["bob"].mailbox) == 2


def test_a_resent_message_id_is_delivered_once() -> None:
    router = make_router()
    alice, bob = join(router, "alice"), join(router, "bob")
    text(alice, "bob", "first", "m-1")
    text(alice, "bob", "first again", "m-1")
    text(alice, "bob", "second", "m-2")
    assert contents(bob) == [("alice", "first"), ("alice", "second")]
    assert alice.take() == []  # a resend is not refused


@pytest.mark.parametrize("trace", [False, True])  # at DEBUG, `deliver` logs then does the same
def test_a_resent_request_reaches_the_receiver_once(trace: bool) -> None:
    cap = {"name": "c", "description": "", "input_schema": {}, "output_schema": {}}
    router = make_router(trace=trace)
    alice, bob = join(router, "alice"), join(router, "bob", capabilities=[cap])
    for _ in range(2):
        alice.to("bob", "REQUEST", {"capability_name": "c"}, conversation_id="k", message_id="r")
    assert [m["message_id"] for m in bob.take()] == ["r"]
    bob.to("alice", "RESPONSE", {"status": "success"}, conversation_id="k")
    assert alice.last()["payload"] == {"status": "success"}
    bob.to("alice", "RESPONSE", {"status": "success"}, conversation_id="k")
    assert bob.last()["payload"]["code"] == "unknown_conversation"  # one REQUEST was open


def test_two_senders_with_the_same_message_id_are_both_delivered() -> None:
    router = make_router()
    alice, carol, bob = join(router, "alice"), join(router, "carol"), join(router, "bob")
    text(alice, "bob", "from alice", "m-1")
    text(carol, "bob", "from carol", "m-1")
    assert contents(bob) == [("alice", "from alice"), ("carol", "from carol")]


@pytest.mark.parametrize("trace", [False, True])  # at DEBUG, `deliver` logs then does the same
def test_a_resend_is_recognised_up_to_the_horizon_and_delivered_again_after_it(
    trace: bool,
) -> None:
    clock = Clock()
    router = make_router(clock, dedupe_horizon=HORIZON, trace=trace)
    alice, bob = join(router, "alice"), join(router, "bob")
    text(alice, "bob", "sent", "m-1")
    clock.now += HORIZON
    text(alice, "bob", "resent at the horizon", "m-1")
    assert contents(bob) == [("alice", "sent")]
    clock.now += 1
    text(alice, "bob", "resent past the horizon", "m-1")
    assert contents(bob) == [("alice", "resent past the horizon")]


def test_trimming_the_dedupe_window_keeps_what_is_within_the_horizon() -> None:
    """`compaction` (run by the server now and then) forgets only ids past the horizon."""
    clock = Clock()
    router = make_router(clock, dedupe_horizon=HORIZON)
    alice, bob = join(router, "alice"), join(router, "bob")
    text(alice, "bob", "old", "m-1")
    clock.now += HORIZON / 2
    text(alice, "bob", "recent", "m-2")
    clock.now += HORIZON / 2 + 1  # m-1 is past the horizon, m-2 within it
    router.compaction()
    text(alice, "bob", "old again", "m-1")
    text(alice, "bob", "recent again", "m-2")
    assert contents(bob) == [("alice", "old"), ("alice", "recent"), ("alice", "old again")]


def test_one_compaction_forgets_at_most_ten_thousand_expired_ids() -> None:
    """Trimming is bounded per compaction (the server's loop must not stall on a huge window):
    the expired ids past the first 10,000 wait for the next one."""
    clock = Clock()
    router = make_router(clock, dedupe_horizon=HORIZON)
    seen = router.state.delivery.seen
    seen.update({("alice", f"m-{n}"): clock.now for n in range(10_001)})
    clock.now += HORIZON + 1
    router.compaction()
    assert list(seen) == [("alice", "m-10000")]
    router.compaction()
    assert not seen


def test_the_dedupe_window_keeps_at_most_its_size_forgetting_the_oldest() -> None:
    router = make_router(dedupe_max=2)
    alice, bob = join(router, "alice"), join(router, "bob")
    for n in (1, 2, 3, 4):
        text(alice, "bob", f"{n}", f"m-{n}")
    router.compaction()
    for n in (1, 2, 3, 4):
        text(alice, "bob", f"{n} again", f"m-{n}")
    assert contents(bob) == [
        *(("alice", f"{n}") for n in (1, 2, 3, 4)),
        ("alice", "1 again"),
        ("alice", "2 again"),
    ]


def test_an_id_exactly_at_the_horizon_is_kept_and_the_checkpoint_says_what_to_keep() -> None:
    clock = Clock()
    router = make_router(clock, dedupe_horizon=HORIZON)
    alice, bob = join(router, "alice"), join(router, "bob", acks=True)
    text(alice, "bob", "1", "m-1")
    bob.send("ACK", {"up_to": 1})
    clock.now += HORIZON  # exactly the horizon: still recognised
    checkpoint = router.compaction()
    assert (checkpoint.acked, checkpoint.forget_before) == (
        {"alice": 0, "bob": 1},
        clock.now - HORIZON,
    )
    text(alice, "bob", "1 again", "m-1")
    assert contents(bob) == [("alice", "1")]


def test_an_ack_beyond_the_last_seq_covers_only_what_was_delivered() -> None:
    router = make_router()
    alice, bob = join(router, "alice"), join(router, "bob", acks=True)
    text(alice, "bob", "1", "m-1")
    bob.take()
    bob.send("ACK", {"up_to": 1000})  # more than the lobby ever delivered to bob
    text(alice, "bob", "2", "m-2")
    text(alice, "bob", "3", "m-3")
    assert [m["seq"] for m in bob.take()] == [2, 3]
    held = resume(bob, acks=True)[1:]
    assert [(m["seq"], m["redelivered"]) for m in held] == [(2, True), (3, True)]
    bob.send("ACK", {"up_to": 3})
    assert resume(bob, acks=True)[1:] == []


def test_the_lobbys_notices_are_held_even_in_a_full_mailbox() -> None:
    clock = Clock()
    router = make_router(clock, mailbox_limit=1)
    buyer, seller = join(router, "buyer", acks=True), join(router, "seller")
    buyer.to("seller", "CFP", {"query": {}, "reply_by": 5}, conversation_id="d1", message_id="1")
    seller.to("buyer", "TEXT", {"content": "hold on"})  # fills the buyer's mailbox
    seller.to("buyer", "TEXT", {"content": "one too many"})
    assert seller.last()["payload"]["code"] == "mailbox_full"  # agents are refused
    clock.now += 6
    world.deliver(router.tick())
    assert [m["message_type"] for m in buyer.take()] == ["TEXT", "DIALOGUE_EXPIRED"]
    held = resume(buyer, acks=True)[1:]
    assert [m["message_type"] for m in held] == ["TEXT", "DIALOGUE_EXPIRED"]


def test_a_cfp_to_oneself_is_refused() -> None:
    router = make_router()
    loner = join(router, "loner")
    loner.to("loner", "CFP", {"query": {}}, conversation_id="d1", message_id="1")
    error = loner.last()
    assert error["payload"]["code"] == "invalid_dialogue"
    assert "rule: not_a_party" in error["payload"]["error"]
    assert loner.take() == []


def test_each_ack_that_moves_on_is_journaled_once() -> None:
    router = make_router()
    alice, bob = join(router, "alice"), join(router, "bob", acks=True)
    for n in range(3):
        text(alice, "bob", str(n), f"m-{n}")
    bob.take()
    router.take_journal()
    bob.send("ACK", {"up_to": 2})
    bob.send("ACK", {"up_to": 2})  # nothing new: nothing to persist
    bob.send("ACK", {"up_to": 1})  # behind: nothing either
    bob.send("ACK", {"up_to": 3})
    assert router.take_journal().records == [Acked("bob", 2), Acked("bob", 3)]
    assert bob.take() == []  # an ACK is never answered


def restarted(router: Router, clock: Clock, *extra: Record) -> Router:
    """A new router restored from what `router` journaled (as a store would hand it back)."""
    snapshot = Snapshot()
    saved: dict[str, dict[str, bytes]] = {}  # a store keeps each key's last document
    for record in [*extra, *router.take_journal().records]:
        if isinstance(record, AgentSaved):
            snapshot.agents.append(record)
        elif isinstance(record, MessageStored):
            snapshot.messages.append(record)
        elif isinstance(record, Acked):
            snapshot.acked[record.receiver] = record.up_to
        elif isinstance(record, StateSaved):
            saved.setdefault(record.kind, {})[record.key] = record.data
    snapshot.state = {kind: list(documents.values()) for kind, documents in saved.items()}
    again = make_router(clock, dedupe_horizon=HORIZON)
    again.restore(snapshot)
    return again


def test_a_restart_restores_mailboxes_numbering_row_ids_and_the_dedupe_window() -> None:
    clock = Clock()
    router = make_router(clock, dedupe_horizon=HORIZON)
    alice, bob = join(router, "alice"), join(router, "bob", acks=True)
    carol = join(router, "carol")
    text(alice, "carol", "to carol", "c-1")  # delivered to a non-acknowledging agent
    for n in (1, 2, 3):
        text(alice, "bob", str(n), f"m-{n}")
    bob.send("ACK", {"up_to": 1})
    bob.take(), carol.take()
    gone = MessageStored(0, "nobody", 1, "alice", "x-1", None, 0, b"{}", clock.now)
    rows = [r.row_id for r in router.delivery.journal if isinstance(r, MessageStored)]
    with capture_logs() as logs:
        again = restarted(router, clock, gone, Acked("nobody", 5))
    assert [(e["event"], e["agents"], e["held_messages"]) for e in logs] == [
        ("LOBBY_RESTORED", 3, 2)
    ]
    again.delivery.journal.clear()
    bob = Peer(again, "bob", bob.session, bob.token)
    held = resume(bob, acks=True)[1:]
    assert [(m["seq"], m["payload"]["content"], m["redelivered"]) for m in held] == [
        (2, "2", True),
        (3, "3", True),
    ]
    alice = Peer(again, "alice", alice.session, alice.token)
    resume(alice)
    text(alice, "bob", "3 again", "m-3")  # a resend from before the restart
    text(alice, "bob", "4", "m-4")
    assert [(m["seq"], m["payload"]["content"]) for m in bob.take()] == [(4, "4")]
    (row,) = [r for r in again.take_journal().records if isinstance(r, MessageStored)]
    assert row.row_id == max(rows) + 1
    assert again.registry.agents["carol"].next_seq == 1
    assert "nobody" not in again.registry.agents


def test_a_restart_restores_trades_and_open_dialogues() -> None:
    clock = Clock()
    router = make_router(clock)
    b, s = join(router, "b"), join(router, "s")
    b.to("s", "CFP", {"query": {}}, conversation_id="d1", message_id="1")
    s.to(
        "b",
        "PROPOSE",
        {"proposal": {"price": 15}},
        conversation_id="d1",
        message_id="2",
        in_reply_to="1",
    )
    b.to("s", "ACCEPT", {}, conversation_id="d1", message_id="3", in_reply_to="2")
    s.to("b", "MATCH_ACCEPT", {}, conversation_id="d1", message_id="4", in_reply_to="3")
    b.to("s", "CFP", {"query": {}}, conversation_id="d2", message_id="5")
    tx = b.inbox[-1]["payload"]["transaction"]
    again = restarted(router, clock)
    b = Peer(again, "b", b.session, b.token)
    s = Peer(again, "s", s.session, s.token)
    resume(b), resume(s)
    b.send("LIST_TRANSACTIONS", {})
    assert b.last()["payload"]["transactions"] == [tx]
    s.to(
        "b",
        "PROPOSE",
        {"proposal": {"price": 9}},
        conversation_id="d2",
        message_id="6",
        in_reply_to="5",
    )
    assert b.last()["message_type"] == "PROPOSE"  # the open dialogue goes on
    s.to(
        "b",
        "PROPOSE",
        {"proposal": {"price": 8}},
        conversation_id="d2",
        message_id="7",
        in_reply_to="6",
    )
    assert "rule: turn_taking" in s.last()["payload"]["error"]


def test_a_restart_keeps_whether_an_agent_acknowledges() -> None:
    """Restored as registered: resuming with the same `acks` changes nothing to journal."""
    clock = Clock()
    router = make_router(clock)
    bob = join(router, "bob", acks=True)
    again = restarted(router, clock)
    assert again.registry.agents["bob"].acks is True
    resume(Peer(again, "bob", bob.session, bob.token), acks=True)
    assert [r for r in again.take_journal().records if isinstance(r, AgentSaved)] == []


def test_a_restart_forgets_ended_dialogues_in_the_order_they_ended_and_counts_open_ones() -> None:
    clock = Clock()
    router = make_router(clock, dedupe_horizon=HORIZON)
    b, s = join(router, "b"), join(router, "s")
    for dialogue_id in ("d1", "d2", "d3", "d4"):
        b.to("s", "CFP", {"query": {}}, conversation_id=dialogue_id, message_id=dialogue_id)
    clock.now += 1
    s.to("b", "DECLINE", {}, conversation_id="d2", message_id="x2", in_reply_to="d2")
    clock.now += 4
    s.to("b", "DECLINE", {}, conversation_id="d1", message_id="x1", in_reply_to="d1")
    again = restarted(router, clock)
    assert again.negotiations.started == {"b": 2}  # d3 and d4 are open
    clock.now += HORIZON - 2  # d2 ended more than the horizon ago, d1 not yet
    again.tick()
    assert set(again.negotiations.dialogues) == {"d1", "d3", "d4"}
    clock.now += 5
    again.tick()
    assert set(again.negotiations.dialogues) == {"d3", "d4"}
    clock.now += 3600  # the default idle timeout: the open ones expire as they would have
    again.tick()
    assert again.negotiations.open == {}


def test_what_a_resume_hands_an_agent_that_does_not_acknowledge_counts_as_delivered() -> None:
    router = make_router()
    alice, bob = join(router, "alice"), join(router, "bob")
    router.close(bob.session)
    text(alice, "bob", "1", "m-1")
    text(alice, "bob", "2", "m-2")
    router.take_journal()
    assert [m["payload"]["content"] for m in resume(bob)[1:]] == ["1", "2"]
    record = router.registry.agents["bob"]
    assert (list(record.mailbox), record.acked_seq, record.delivered_seq) == ([], 2, 2)
    assert router.take_journal().records == [Acked("bob", 2)]
    router.close(bob.session)
    assert resume(bob)[1:] == []  # nothing held any more
    text(alice, "bob", "3", "m-3")
    assert [(m["seq"], m["payload"]["content"]) for m in bob.take()] == [(3, "3")]


def test_at_debug_a_request_is_stored_as_opening_and_a_notice_forced_into_a_full_mailbox() -> None:
    router = make_router(trace=True, mailbox_limit=1)
    alice = join(router, "alice")
    join(router, "bob", capabilities=[cap("c")])
    request(alice)
    (stored,) = [r for r in router.take_journal().records if isinstance(r, MessageStored)]
    assert (stored.receiver, stored.effect) == ("bob", Effect.OPENS)
    router.close(router.registry.agents["bob"].session)  # type: ignore[arg-type]
    for _ in range(2):
        router.state.notify(("bob",), MessageType.DIALOGUE_EXPIRED, {}, "d", 1.0)
    assert len(router.registry.agents["bob"].mailbox) == 2


def test_a_senders_seq_and_redelivered_never_reach_the_receiver() -> None:
    router = make_router()
    alice, bob = join(router, "alice"), join(router, "bob")
    alice.to("bob", "TEXT", {"content": "hi"}, message_id="t1", seq=99, redelivered=True)
    assert bob.last() == {
        "sender_id": "alice",
        "receiver_id": "bob",
        "message_type": "TEXT",
        "payload": {"content": "hi"},
        "message_id": "t1",
        "seq": 1,
    }


def test_a_message_written_to_a_non_acknowledging_agent_is_stored_without_its_frame() -> None:
    router = make_router()
    alice = join(router, "alice")
    join(router, "online")
    join(router, "acking", acks=True)
    offline = join(router, "offline")
    router.close(offline.session)
    router.take_journal()
    for receiver in ("online", "acking", "offline"):
        alice.to(receiver, "TEXT", {"content": "hi"}, message_id=f"t-{receiver}")
    stored = [r for r in router.take_journal().records if isinstance(r, MessageStored)]
    assert [(r.receiver, r.frame == DELIVERED) for r in stored] == [
        ("online", True),  # written to its connection: nothing to send again
        ("acking", False),
        ("offline", False),
    ]
    assert orjson.loads(stored[1].frame)["message_id"] == "t-acking"
