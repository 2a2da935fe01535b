"""agent_sdk/dispatch.py: what an agent does with each frame, driven synchronously (no loop,
no socket): frames in, actions out."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from agent_sdk.dispatch import (
    ROOM_FREED,
    Answer,
    Deliver,
    Dispatcher,
    LobbyComplaint,
    Refusal,
    Reply,
    SeenMessages,
    Unreadable,
)
from agent_sdk.stats import AgentStats
from protocol.codec import decode, encode
from protocol.models import LOBBY_ID, Message, MessageType

ME = "me"


@dataclass
class Awaited:
    """A call as the dispatcher sees it (`calls.Call` in the agent)."""

    receiver_id: str


def dispatcher(
    *,
    calls: Mapping[str, Awaited] | None = None,
    questions: set[str] | None = None,
    max_unconfirmed: int = 10,
    dedupe_window: int = 100,
) -> Dispatcher:
    return Dispatcher(
        AgentStats(),
        calls=calls if calls is not None else {},
        questions=questions if questions is not None else set(),
        dedupe_window=dedupe_window,
        max_unconfirmed=max_unconfirmed,
    )


def frame(
    sender_id: str,
    message_type: MessageType,
    payload: dict[str, Any] | None = None,
    **envelope: Any,
) -> bytes:
    return encode(Message(sender_id, ME, message_type, payload or {}, **envelope))


def sent(message_id: str, receiver_id: str = "other") -> Message:
    return Message(ME, receiver_id, MessageType.TEXT, {}, message_id=message_id)


def test_an_unreadable_frame_is_reported_and_counts_for_nothing() -> None:
    d = dispatcher()
    (action,) = d.receive(b"{not json")
    assert isinstance(action, Unreadable)
    assert "invalid JSON" in action.reason
    assert d.stats.messages_received == 0


def test_a_message_seen_before_from_the_same_sender_is_dropped_and_settled() -> None:
    d = dispatcher()
    first = frame("alice", MessageType.TEXT, message_id="m1", seq=1)
    assert d.receive(first) == [Deliver(decode(first))]
    d.start(1)
    again = frame("alice", MessageType.TEXT, message_id="m1", seq=2, redelivered=True)
    assert d.receive(again) == []
    assert d.stats.duplicates_dropped == 1
    assert d.stats.messages_received == 2
    # The same id from another sender is another message.
    other = frame("bob", MessageType.TEXT, message_id="m1", seq=3)
    assert d.receive(other) == [Deliver(decode(other))]
    assert d.ack_due() is None  # seq 1 is still running
    d.finish(1, 0)
    d.settle(3)
    assert d.ack_due() == 3  # the duplicate's seq 2 was settled on arrival


def test_the_dedupe_window_forgets_the_oldest() -> None:
    seen = SeenMessages(2)
    assert not seen.check_and_add("a", "1")
    assert not seen.check_and_add("a", "2")
    assert seen.check_and_add("a", "1")
    assert not seen.check_and_add("a", "3")  # "1" is forgotten now
    assert not seen.check_and_add("a", "1")


def test_a_response_answers_the_call_awaiting_it_only_from_its_receiver_or_the_lobby() -> None:
    calls = {"c1": Awaited("seller")}
    d = dispatcher(calls=calls)
    progress = frame(
        "seller", MessageType.RESPONSE, {"status": "in_progress"}, conversation_id="c1"
    )
    assert d.receive(progress) == [Answer("c1", {"status": "in_progress"})]
    stranger = frame("mallory", MessageType.RESPONSE, {"status": "success"}, conversation_id="c1")
    assert d.receive(stranger) == [Deliver(decode(stranger))]
    by_lobby = frame(LOBBY_ID, MessageType.RESPONSE, {"status": "error"}, conversation_id="c1")
    assert d.receive(by_lobby) == [Answer("c1", {"status": "error"})]
    del calls["c1"]  # the caller stopped waiting
    late = frame("seller", MessageType.RESPONSE, {"status": "success"}, conversation_id="c1")
    assert d.receive(late) == [Deliver(decode(late))]


def test_a_call_addressed_to_the_lobby_is_answered_by_whichever_provider_it_chose() -> None:
    d = dispatcher(calls={"c1": Awaited(LOBBY_ID)})
    answer = frame("carol", MessageType.RESPONSE, {"status": "success"}, conversation_id="c1")
    (action,) = d.receive(answer)
    assert isinstance(action, Answer)
    assert (action.conversation_id, action.sender_id) == ("c1", "carol")


def test_a_lobby_error_naming_an_awaited_call_refuses_it() -> None:
    d = dispatcher(calls={"c1": Awaited("nobody")})
    error = {
        "error": "Agent 'nobody' is not registered.",
        "code": "unknown_receiver",
        "original_message_type": "REQUEST",
        "original_conversation_id": "c1",
    }
    refused = frame(LOBBY_ID, MessageType.ERROR, error, conversation_id="c1")
    assert d.receive(refused) == [Refusal("c1", "unknown_receiver", error["error"])]


def test_a_lobby_error_about_nothing_awaited_is_a_complaint_and_reaches_on_message() -> None:
    d = dispatcher()
    error = {"error": "no", "code": "malformed", "original_conversation_id": None}
    stray = frame(LOBBY_ID, MessageType.ERROR, error)
    assert d.receive(stray) == [LobbyComplaint("malformed", "no"), Deliver(decode(stray))]


def test_a_lobby_message_in_a_questions_conversation_is_its_reply_while_asked() -> None:
    questions = {"q1", "q2"}
    d = dispatcher(questions=questions)
    answer = frame(
        LOBBY_ID, MessageType.SERVICES_AVAILABLE, {"services_found": []}, conversation_id="q1"
    )
    (reply,) = d.receive(answer)
    assert reply == Reply("q1", decode(answer))
    questions.discard("q1")  # answered: the asker forgets it
    again = frame(
        LOBBY_ID, MessageType.PAYMENT_CONFIRMED, {"transaction": {}}, conversation_id="q1"
    )
    assert d.receive(again) == [Deliver(decode(again))]
    # Only the lobby answers a question.
    other = frame("alice", MessageType.TEXT, {"content": "hi"}, conversation_id="q2")
    assert d.receive(other) == [Deliver(decode(other))]


def test_a_request_is_always_delivered_even_in_an_awaited_conversation() -> None:
    d = dispatcher(calls={"c1": Awaited("alice")})
    request = frame("alice", MessageType.REQUEST, {"capability_name": "x"}, conversation_id="c1")
    assert d.receive(request) == [Deliver(decode(request))]


def test_accepted_confirms_sends_in_order_and_frees_room_below_the_limit() -> None:
    d = dispatcher(max_unconfirmed=2)
    for message_id in ("s1", "s2"):
        d.outbound.add(sent(message_id))
    assert d.outbound.full
    accepted_s1 = frame(LOBBY_ID, MessageType.ACCEPTED, {"message_id": "s1"})
    assert d.receive(accepted_s1) == [ROOM_FREED]
    assert [m.message_id for m in d.outbound.unconfirmed()] == ["s2"]
    d.outbound.add(sent("s3"))
    d.outbound.add(sent("s4"))
    unknown = frame(LOBBY_ID, MessageType.ACCEPTED, {"message_id": "never-sent"})
    assert d.receive(unknown) == []  # still full: nobody to wake
    # ACCEPTED covers the message it names and everything sent before it.
    assert d.receive(frame(LOBBY_ID, MessageType.ACCEPTED, {"message_id": "s3"})) == [ROOM_FREED]
    assert [m.message_id for m in d.outbound.unconfirmed()] == ["s4"]


def test_a_refused_send_is_settled_and_the_refusal_goes_on_to_whoever_waits() -> None:
    d = dispatcher(calls={"c1": Awaited("nobody")})
    d.outbound.add(sent("s1", receiver_id="nobody"))
    error = {"error": "unknown", "code": "unknown_receiver", "original_conversation_id": "c1"}
    refused = frame(LOBBY_ID, MessageType.ERROR, error, conversation_id="c1", in_reply_to="s1")
    assert d.receive(refused) == [ROOM_FREED, Refusal("c1", "unknown_receiver", "unknown")]
    assert len(d.outbound) == 0  # never resent


def test_what_the_dispatcher_takes_itself_is_settled_and_acknowledged() -> None:
    d = dispatcher(calls={"c1": Awaited("seller")})
    d.outbound.add(sent("s1"))
    d.receive(frame(LOBBY_ID, MessageType.ACCEPTED, {"message_id": "s1"}, seq=1))
    d.receive(
        frame("seller", MessageType.RESPONSE, {"status": "success"}, conversation_id="c1", seq=2)
    )
    assert d.take_ack() == 2
    assert d.take_ack() is None  # nothing new since


def test_an_ack_waits_for_the_oldest_message_still_handled() -> None:
    d = dispatcher()
    for seq in (1, 2, 3):
        d.receive(frame("alice", MessageType.TEXT, message_id=f"m{seq}", seq=seq))
    first = d.start(1)
    d.settle(2)
    third = d.start(3)
    assert d.ack_due() is None
    d.finish(3, third)
    assert d.ack_due() is None  # 1 still runs
    d.finish(1, first)
    assert d.take_ack() == 3


def test_a_fresh_registration_restarts_numbering_and_ignores_old_completions() -> None:
    d = dispatcher()
    d.receive(frame("alice", MessageType.TEXT, message_id="m1", seq=7))
    old_epoch = d.start(7)
    d.registered(resumed=True)
    assert d.ack_due() == 6  # a resume keeps the numbering: 7 still runs
    d.registered(resumed=False)
    d.receive(frame("alice", MessageType.TEXT, message_id="m2", seq=1))
    d.start(1)
    d.finish(1, old_epoch)  # a completion from before the new registration
    assert d.ack_due() is None
    d.finish(1, old_epoch + 1)
    assert d.take_ack() == 1


def test_messages_without_seq_need_no_bookkeeping() -> None:
    d = dispatcher()
    message = frame("alice", MessageType.TEXT, {"content": "hi"})
    assert d.receive(message) == [Deliver(decode(message))]
    epoch = d.start(None)
    d.finish(None, epoch)
    d.settle(None)
    assert d.ack_due() is None
    assert d.stats.messages_received == 1


def test_unknown_envelope_fields_are_ignored_and_the_payload_passed_as_sent() -> None:
    d = dispatcher(calls={"c1": Awaited("seller")})
    payload = {"status": "success", "nested": {"items": [1, 2, 3]}}
    raw = orjson.dumps(
        {
            "sender_id": "seller",
            "receiver_id": ME,
            "message_type": "RESPONSE",
            "payload": payload,
            "conversation_id": "c1",
            "unknown_field": "ignored",
        }
    )
    assert d.receive(raw) == [Answer("c1", payload)]


def test_an_abandoned_message_is_handled_when_it_comes_again_and_held_from_acks_until() -> None:
    d = dispatcher()
    first = frame("alice", MessageType.TEXT, message_id="m1", seq=1)
    d.receive(first)
    epoch = d.start(1)
    d.receive(frame("alice", MessageType.TEXT, message_id="m2", seq=2))
    d.settle(2)
    d.abandon(decode(first), epoch)  # the agent stopped mid-handler
    d.finish(1, epoch)  # the cancelled task ends, but did not handle it
    assert d.ack_due() is None  # never acknowledged: the lobby must deliver it again
    again = frame("alice", MessageType.TEXT, message_id="m1", seq=1, redelivered=True)
    assert d.receive(again) == [Deliver(decode(again))]  # not a duplicate now
    d.finish(1, d.start(1))
    assert d.take_ack() == 2
    assert d.receive(again) == []  # handled once: a further copy is a duplicate


def test_abandoning_a_message_without_seq_or_from_an_old_epoch_changes_nothing() -> None:
    d = dispatcher()
    old = frame("alice", MessageType.TEXT, message_id="m1", seq=1)
    d.receive(old)
    old_epoch = d.start(1)
    d.registered(resumed=False)  # numbering restarts: seq 1 is another message now
    again = frame("alice", MessageType.TEXT, message_id="m2", seq=1)
    d.receive(again)
    d.finish(1, d.start(1))
    d.abandon(decode(old), old_epoch)
    d.abandon(decode(frame("alice", MessageType.TEXT, message_id="m3")), d.inbound.epoch)
    assert d.take_ack() == 1
    assert d.receive(old) == []  # m1 stays seen: its abandonment came too late to matter


def test_forgetting_a_message_never_seen_is_harmless() -> None:
    seen = SeenMessages(2)
    seen.forget("alice", "m1")
    assert not seen.check_and_add("alice", "m1")
    seen.forget("alice", "m1")
    assert not seen.check_and_add("alice", "m1")


def test_each_message_the_dispatcher_takes_itself_is_acknowledged_alone() -> None:
    """Duplicate, ACCEPTED, answer, reply, refusal: each one, the last to arrive, is settled."""
    error = {"error": "no", "code": "mailbox_full", "original_conversation_id": "c1"}
    cases = [
        frame(LOBBY_ID, MessageType.ACCEPTED, {"message_id": "s1"}, seq=1),
        frame("seller", MessageType.RESPONSE, {"status": "success"}, conversation_id="c1", seq=1),
        frame(LOBBY_ID, MessageType.MESSAGES, {"messages": []}, conversation_id="q1", seq=1),
        frame(LOBBY_ID, MessageType.ERROR, error, conversation_id="c1", seq=1),
    ]
    for taken in cases:
        d = dispatcher(calls={"c1": Awaited("seller")}, questions={"q1"})
        d.outbound.add(sent("s1"))
        d.receive(taken)
        assert d.take_ack() == 1, taken
    d = dispatcher()
    d.receive(frame("alice", MessageType.TEXT, message_id="m1", seq=1))
    d.finish(1, d.start(1))
    d.take_ack()
    for seq in (2, 3):  # redelivered twice after a reconnect: both dropped, both settled
        assert d.receive(frame("alice", MessageType.TEXT, message_id="m1", seq=seq)) == []
        assert d.take_ack() == seq
    assert d.stats.duplicates_dropped == 2


def test_every_fresh_registration_is_a_new_epoch() -> None:
    d = dispatcher()
    first = d.start(None)
    d.registered(resumed=False)
    second = d.start(None)
    d.registered(resumed=False)
    assert len({first, second, d.start(None)}) == 3  # a completion from any earlier one is stale
