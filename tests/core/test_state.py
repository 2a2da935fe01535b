"""The state every handler shares (lobby/core/state.py), synchronously: the helpers handlers
answer with build the same frames whoever calls them."""

from __future__ import annotations

import re

import orjson
import pytest
from structlog.testing import capture_logs

from lobby.core import LobbyState, Send, Session
from lobby.core.discovery.registry import Registry
from lobby.core.records import AgentSaved, StateSaved
from lobby.core.refusal import Refusal
from lobby.core.session import REVOKED, AgentRecord
from protocol.models import ErrorCode, Message, MessageType
from protocol.payloads import Capability
from tests.routerkit import Clock, cap, frames, join, make_router, raw


def state_with(*agent_ids: str, mailbox_limit: int = 10) -> LobbyState:
    state = LobbyState(mailbox_limit=mailbox_limit, clock=Clock())
    for agent_id in agent_ids:
        state.registry.add(AgentRecord(agent_id, b"hash", acks=True))
    return state


def test_an_error_goes_to_the_sender_alone_with_the_one_payload_shape() -> None:
    state = state_with("alice")
    session = Session()
    session.agent = state.registry.agents["alice"]
    msg = Message("alice", "bob", MessageType.TEXT, {}, "k1", message_id="m-1")
    (action,) = state.error(session, msg, ErrorCode.UNKNOWN_RECEIVER, "no agent 'bob'")
    assert isinstance(action, Send)
    assert action.session is session
    frame = orjson.loads(action.frame)
    assert (frame["sender_id"], frame["receiver_id"]) == ("global_lobby", "alice")
    assert frame["in_reply_to"] == "m-1"
    assert frame["payload"] == {
        "error": "no agent 'bob'",
        "code": "unknown_receiver",
        "original_message_type": "TEXT",
        "original_conversation_id": "k1",
    }
    assert state.delivery.journal == []  # an ERROR is never stored


def test_an_undecodable_frame_is_refused_with_what_could_be_read_of_it() -> None:
    state = state_with()
    (action,) = state.error(
        Session(), None, ErrorCode.MALFORMED, "bad", message_type="REQUEST", conversation_id="c"
    )
    assert isinstance(action, Send)
    payload = orjson.loads(action.frame)["payload"]
    assert (payload["original_message_type"], payload["original_conversation_id"]) == (
        "REQUEST",
        "c",
    )


def test_a_notice_is_held_for_each_party_even_in_a_full_mailbox() -> None:
    state = state_with("alice", "bob", mailbox_limit=0)
    actions = state.notify(("alice", "bob", "gone"), MessageType.DIALOGUE_EXPIRED, {}, "d", 1.0)
    assert actions == []  # both offline: held, not sent
    for agent_id in ("alice", "bob"):
        ((seq, frame),) = state.registry.agents[agent_id].mailbox
        assert seq == 1
        assert orjson.loads(frame)["message_type"] == "DIALOGUE_EXPIRED"


def test_a_full_mailbox_refuses_a_delivered_message_and_changes_nothing() -> None:
    state = state_with("bob", mailbox_limit=0)
    bob = state.registry.agents["bob"]
    msg = Message("alice", "bob", MessageType.TEXT, {"content": "hi"})
    with pytest.raises(Refusal) as refused:
        state.deliver(bob, msg, None, 0, 1.0)
    assert refused.value.code == ErrorCode.MAILBOX_FULL
    assert (bob.next_seq, len(bob.mailbox), state.delivery.journal) == (0, 0, [])


def test_the_receiver_of_a_message_must_be_registered() -> None:
    state = state_with("bob")
    known = Message("alice", "bob", MessageType.TEXT, {})
    assert state.receiver(known) is state.registry.agents["bob"]
    with pytest.raises(Refusal) as refused:
        state.receiver(Message("alice", "carol", MessageType.TEXT, {}))
    assert refused.value.code == ErrorCode.UNKNOWN_RECEIVER


def test_what_must_survive_a_restart_is_journaled() -> None:
    state = state_with("alice")
    state.save(state.registry.agents["alice"])
    tx = {"transaction_id": "tx-1", "buyer": "alice", "seller": "bob"}
    state.record(tx)
    assert state.ledger.of("bob") == [tx]
    saved, recorded = state.delivery.take_journal().records
    assert isinstance(saved, AgentSaved)
    assert (saved.agent_id, saved.capabilities, saved.acks) == ("alice", b"[]", True)
    assert recorded == StateSaved("transaction", "tx-1", orjson.dumps(tx))


def test_removing_an_agent_that_is_not_there_changes_nothing() -> None:
    router = make_router()
    join(router, "seller", capabilities=[{"name": "c", "description": "does c"}])
    assert router.registry.remove("nobody") is None
    router.registry.search.remove_agent("nobody")
    assert set(router.registry.agents) == {"seller"}


def test_a_session_shows_its_agent_and_address() -> None:
    router = make_router()
    session = router.open("10.0.0.1:5000")
    assert repr(session) == f"Session(id={session.id}, agent=None, remote='10.0.0.1:5000')"
    peer = join(router, "seller")
    assert repr(peer.session) == f"Session(id={peer.session.id}, agent='seller', remote='seller')"


def test_an_error_on_a_connection_not_registered_goes_to_the_sender_it_named() -> None:
    """Before REGISTER there is no agent: the ERROR is addressed to the frame's sender_id, or
    to no one ("") when not even that could be read; at DEBUG each refusal is one line."""
    router = make_router(trace=True)
    session = router.open()
    with capture_logs() as logs:
        (named,) = frames(raw(router, session, sender_id="a", message_type="DISCOVER_SERVICES"))
        (unread,) = frames(router.handle(session, "{nonsense"))
    assert (named["receiver_id"], named["payload"]["code"]) == ("a", "not_registered")
    assert (unread["receiver_id"], unread["payload"]["code"]) == ("", "malformed")
    assert [(e["event"], e["code"], e["reason"], e["session"]) for e in logs] == [
        ("MESSAGE_REFUSED", "not_registered", named["payload"]["error"], session.id),
        ("MESSAGE_REFUSED", "malformed", unread["payload"]["error"], session.id),
    ]
    assert router.counters.refused["not_registered"] == 1


def test_an_undecodable_frame_is_refused_to_its_registered_sender_with_what_could_be_read() -> None:
    router = make_router()
    peer = join(router, "a")
    (error,) = frames(
        raw(
            router,
            peer.session,
            sender_id="a",
            receiver_id="b",
            message_type="TEXT",
            payload=5,
            conversation_id="c",
        )
    )
    assert {k: v for k, v in error.items() if k != "message_id"} == {
        "sender_id": "global_lobby",
        "receiver_id": "a",
        "message_type": "ERROR",
        "payload": {
            "error": "field 'payload' must be an object, not a number",
            "code": "malformed",
            "original_message_type": "TEXT",
            "original_conversation_id": "c",
        },
        "conversation_id": "c",
    }


def test_a_refusal_is_logged_at_debug_in_its_messages_trace() -> None:
    router = make_router(trace=True)
    peer = join(router, "a")
    traced = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    with capture_logs() as logs:
        peer.to("nobody", "TEXT", {"content": "hi"}, traceparent=traced)
    (refused,) = [e for e in logs if e["event"] == "MESSAGE_REFUSED"]
    assert refused["trace_id"] == "4bf92f3577b34da6a3ce929d0e0e4736"


def test_a_refusal_pauses_nothing_unless_told_and_says_its_reason() -> None:
    refusal = Refusal(ErrorCode.MALFORMED, "why")
    assert (refusal.pause, str(refusal)) == (0.0, "why")
    router = make_router()
    peer = join(router, "a")
    actions = raw(
        router,
        peer.session,
        sender_id="a",
        receiver_id="x",
        message_type="TEXT",
        payload={"content": "hi"},
        auth_token=peer.token,
    )
    assert [type(action) for action in actions] == [Send]


def test_a_replica_of_the_search_index_holds_agents_that_no_token_opens() -> None:
    lobby = Registry()
    lobby.replicating = True
    record = AgentRecord("a", b"hash")
    lobby.add(record)
    lobby.set_capabilities(record, [Capability.model_validate(cap("translate"))])
    wire = record.capabilities["translate"].wire
    assert lobby.changes == [("offer", "a", []), ("offer", "a", [wire])]
    assert lobby.snapshot() == [("offer", "a", [wire])]
    replica = Registry()
    replica.offer("a", dict(record.capabilities))
    copy = replica.get("a")
    assert copy is not None
    assert (copy.token_hash, list(copy.capabilities)) == (REVOKED, ["translate"])
    replica.offer("a", {})
    assert replica.get("a") is copy
    assert copy.capabilities == {}


def test_a_registry_records_changes_only_once_a_replica_follows_it() -> None:
    """A lobby without a discovery worker keeps no list of changes (it would only grow)."""
    registry = Registry()
    assert registry.replicating is False
    record = AgentRecord("a", b"hash")
    registry.add(record)
    registry.set_capabilities(record, [Capability.model_validate(cap("translate"))])
    registry.remove("a")
    assert registry.changes == []
    registry.replicating = True
    registry.add(record)
    registry.remove("a")
    assert registry.changes == [
        ("offer", "a", [record.capabilities["translate"].wire]),
        ("remove", "a"),
    ]


def test_ids_the_lobby_assigns_are_numbered_from_one_under_a_prefix_of_this_run() -> None:
    """Message ids `<12 hex>-<n>` and transaction ids `tx-<8 hex>-<n>` (PROTOCOL.md §8's
    example): unique within a run by their number, across runs by their random prefix."""
    runs = [LobbyState(mailbox_limit=10), LobbyState(mailbox_limit=10)]
    for state in runs:
        notices = [orjson.loads(state.from_lobby("bob", MessageType.TEXT, {})) for _ in "ab"]
        prefix = notices[0]["message_id"].removesuffix("-1")
        assert re.fullmatch("[0-9a-f]{12}", prefix)
        assert [n["message_id"] for n in notices] == [f"{prefix}-1", f"{prefix}-2"]
        assert state.delivery.new_message_id() == f"{prefix}-3"
        first = state.ledger.new_id()
        assert re.fullmatch("tx-[0-9a-f]{8}-1", first)
        assert state.ledger.new_id() == first.removesuffix("1") + "2"
    assert runs[0].delivery.new_message_id()[:12] != runs[1].delivery.new_message_id()[:12]
    assert runs[0].ledger.new_id()[:11] != runs[1].ledger.new_id()[:11]
    assert not runs[0].trace  # DEBUG lines per move only when asked for


def test_a_session_opened_without_details_has_no_address_and_keeps_its_link() -> None:
    router = make_router()
    for session in (Session(), router.open()):
        assert (session.remote, session.host, session.link, session.agent) == ("", "", None, None)
    link = object()
    session = router.open("10.0.0.7:5000", link, "10.0.0.7")
    assert (session.remote, session.link, session.host) == ("10.0.0.7:5000", link, "10.0.0.7")
