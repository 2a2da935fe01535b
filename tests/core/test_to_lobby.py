"""Messages addressed to the lobby itself, synchronously through the Router: DISCOVER_SERVICES,
UPDATE_CAPABILITIES, UNREGISTER, FETCH_MESSAGES (lobby/core/to_lobby.py)."""

from __future__ import annotations

import orjson
from structlog.testing import capture_logs

from lobby.core import Close, Pause, Router
from lobby.core.limits import MAX_PAUSE, Limits
from lobby.core.records import AgentRemoved
from tests.routerkit import Clock, cap, frames, join, make_router, pair, raw, request


def test_discovery_by_name_and_keywords_excludes_the_requester() -> None:
    router = make_router()
    join(router, "hunter", capabilities=[cap("price", keywords=["Shopping", "deals"])])
    join(router, "other", capabilities=[cap("weather", keywords=["sky"])])
    me = join(router, "me", capabilities=[cap("price", keywords=["shopping"])])
    me.send("DISCOVER_SERVICES", {"capability_name": "price"})
    payload = me.last()["payload"]
    assert payload == {
        "services_found": [
            {
                "agent_id": "hunter",
                # As registered, but without null for a list or a map: the field is left out.
                "relevant_capabilities": [
                    {
                        key: value
                        for key, value in cap("price", keywords=["Shopping", "deals"]).items()
                        if value is not None
                    }
                ],
                "online": True,
            }
        ],
        "discovered_for_capability": "price",
        "next": None,
    }
    me.send("DISCOVER_SERVICES", {"keywords": ["SHOPPING", "sky"]})
    assert [s["agent_id"] for s in me.last()["payload"]["services_found"]] == ["hunter", "other"]
    me.send("DISCOVER_SERVICES", {"query_keywords": ["sky"]})
    assert [s["agent_id"] for s in me.last()["payload"]["services_found"]] == ["other"]


def test_discovery_shows_offline_agents_as_offline() -> None:
    router = make_router()
    hunter = join(router, "hunter", capabilities=[cap("price")])
    router.close(hunter.session)
    me = join(router, "me")
    me.send("DISCOVER_SERVICES", {"capability_name": "price"})
    (service,) = me.last()["payload"]["services_found"]
    assert service["online"] is False


def test_update_capabilities_and_unregister() -> None:
    router, alice, bob = pair()
    bob.send("UPDATE_CAPABILITIES", {"capabilities": [cap("d")]})
    assert bob.take() == []
    request(alice)
    assert alice.last()["payload"]["code"] == "capability_not_found"
    actions = router.handle(
        bob.session,
        orjson.dumps(
            {
                "sender_id": "bob",
                "receiver_id": "global_lobby",
                "message_type": "UNREGISTER",
                "payload": {},
                "auth_token": bob.token,
            }
        ).decode(),
    )
    assert [(a.code) for a in actions if isinstance(a, Close)] == [4003]
    assert "bob" not in router.registry.agents
    (ack,) = frames(
        raw(router, router.open(), sender_id="bob", message_type="REGISTER", auth_token=bob.token)
    )
    assert ack["payload"]["auth_token"] != bob.token  # the old token is gone; a new agent


def test_the_discovery_rate_refills_with_the_router_clock() -> None:
    clock = Clock()
    router = Router(
        limits=Limits(message_rate=0, registration_rate=0, discover_rate=2, discover_burst=1),
        clock=clock,
    )
    seeker = join(router, "seeker")
    kinds = []
    for _ in range(2):
        seeker.send("DISCOVER_SERVICES", {})
        kinds.append(seeker.last()["message_type"])
    assert kinds == ["SERVICES_AVAILABLE", "ERROR"]
    clock.now += 0.5  # one more query's worth at 2 a second
    seeker.send("DISCOVER_SERVICES", {})
    assert seeker.last()["message_type"] == "SERVICES_AVAILABLE"
    seeker.send("DISCOVER_SERVICES", {})
    refused = seeker.last()["payload"]
    assert (refused["code"], refused["error"]) == (
        "rate_limited",
        "agent 'seeker' sends more than 2 DISCOVER_SERVICES a second; this one was not answered",
    )


def test_past_a_rate_limit_the_connection_is_paused_until_the_next_token() -> None:
    """A refusal per frame would cost the lobby as much as routing it: past a rate, the
    sender's connection is not read until its bucket holds a token again."""
    clock = Clock()
    router = Router(
        limits=Limits(
            message_rate=2, message_burst=2, registration_rate=0, discover_rate=2, discover_burst=1
        ),
        clock=clock,
    )
    seeker = join(router, "seeker")
    query = {"sender_id": "seeker", "message_type": "DISCOVER_SERVICES", "auth_token": seeker.token}
    answered = raw(router, seeker.session, **query)
    while router.queries:
        answered += router.answer_query()
    assert not [a for a in answered if isinstance(a, Pause)]
    refused = raw(router, seeker.session, **query)  # the discovery bucket is empty
    assert [frame["payload"]["code"] for frame in frames(refused)] == ["rate_limited"]
    assert refused[-1] == Pause(seeker.session, 0.5)  # one token at 2 a second
    clock.now += 0.5
    # The message rate (2 a second, 2 at once): both spent above, one back since.
    text = {"sender_id": "seeker", "message_type": "LIST_TRANSACTIONS", "auth_token": seeker.token}
    assert not [a for a in raw(router, seeker.session, **text) if isinstance(a, Pause)]
    flooded = raw(router, seeker.session, **text)
    assert [frame["payload"]["code"] for frame in frames(flooded)] == ["rate_limited"]
    assert flooded[-1] == Pause(seeker.session, 0.5)


def test_a_pause_is_never_longer_than_a_second_whatever_the_rate() -> None:
    """At a rate of one query a minute, a minute without reading would outlast the keepalive."""
    router = Router(
        limits=Limits(message_rate=0, registration_rate=0, discover_rate=1 / 60, discover_burst=1),
        clock=Clock(),
    )
    seeker = join(router, "seeker")
    query = {"sender_id": "seeker", "message_type": "DISCOVER_SERVICES", "auth_token": seeker.token}
    raw(router, seeker.session, **query)
    while router.queries:
        router.answer_query()
    assert raw(router, seeker.session, **query)[-1] == Pause(seeker.session, MAX_PAUSE)


def test_fetch_messages_reads_the_same_mailbox_as_push() -> None:
    router = make_router()
    sender = join(router, "sender")
    poller = join(router, "poller", acks=True)
    for n in range(5):
        sender.to("poller", "TEXT", {"content": str(n)})
    pushed = poller.take()
    poller.send("FETCH_MESSAGES", {"limit": 3})
    first = poller.last()["payload"]
    assert first["messages"] == pushed[:3]
    poller.send("FETCH_MESSAGES", {"since": first["cursor"]})
    rest = poller.last()["payload"]
    assert rest["messages"] == pushed[3:]
    poller.send("FETCH_MESSAGES", {"since": rest["cursor"]})
    assert poller.last()["payload"]["messages"] == []
    assert not router.registry.agents["poller"].mailbox  # fetched = acknowledged


def test_an_ack_needs_a_non_negative_integer_and_zero_is_one() -> None:
    router = make_router()
    bob = join(router, "bob", acks=True)
    bob.send("ACK", {"up_to": 0})
    assert bob.take() == []
    for bad in (-1, "3", 1.5, True, None):
        bob.send("ACK", {"up_to": bad})
        error = bob.last()
        assert (error["message_type"], error["payload"]["code"], error["payload"]["error"]) == (
            "ERROR",
            "malformed",
            "an ACK payload needs a non-negative integer 'up_to'",
        ), bad


def test_unregister_detaches_journals_logs_and_closes_with_its_reason() -> None:
    router, alice, bob = pair()
    record = router.registry.agents["bob"]
    record.acks = True
    alice.to("bob", "TEXT", {"content": "held"})
    router.take_journal()
    with capture_logs() as logs:
        actions = raw(
            router, bob.session, sender_id="bob", message_type="UNREGISTER", auth_token=bob.token
        )
    (close,) = actions
    assert isinstance(close, Close)
    assert (close.session, close.code, close.reason) == (bob.session, 4003, "unregistered")
    assert (record.session, bob.session.agent) == (None, None)
    assert router.take_journal().records == [AgentRemoved("bob")]
    assert [(e["event"], e["agent_id"], e["dropped"]) for e in logs] == [
        ("AGENT_UNREGISTERED", "bob", 1)
    ]


def test_the_lobbys_answers_go_back_to_the_asker_in_its_conversation() -> None:
    router = make_router()
    poller = join(router, "poller", acks=True)
    for kind in ("FETCH_MESSAGES", "LIST_TRANSACTIONS"):
        poller.send(kind, {}, conversation_id=f"c-{kind}", message_id=f"m-{kind}")
        answer = poller.last()
        assert (
            answer["sender_id"],
            answer["receiver_id"],
            answer["conversation_id"],
            answer["in_reply_to"],
        ) == ("global_lobby", "poller", f"c-{kind}", f"m-{kind}")
        assert (
            answer["message_type"]
            == {
                "FETCH_MESSAGES": "MESSAGES",
                "LIST_TRANSACTIONS": "TRANSACTIONS",
            }[kind]
        )


def test_updated_capabilities_are_logged_by_name_up_to_a_sentence() -> None:
    _, _, bob = pair()
    names = [f"capability_{n}_" + "x" * 40 for n in range(4)]  # past a clipped value's length
    with capture_logs() as logs:
        bob.send("UPDATE_CAPABILITIES", {"capabilities": [cap(n) for n in reversed(names)]})
    assert bob.take() == []
    assert [(e["event"], e["agent_id"], e["capabilities"]) for e in logs] == [
        ("AGENT_CAPABILITIES_UPDATED", "bob", ", ".join(names))
    ]


def test_a_query_handed_to_a_replica_is_answered_in_its_room_or_dropped_with_its_connection() -> (
    None
):
    router = make_router()
    asker = join(router, "asker")
    discover = {"sender_id": "asker", "message_type": "DISCOVER_SERVICES"}
    assert (
        raw(router, asker.session, auth_token=asker.token, conversation_id="q1", **discover) == []
    )
    waiting = router.to_lobby.take_query()
    assert waiting is not None
    assert waiting.message_id
    envelope = {
        "sender_id": "global_lobby",
        "receiver_id": "asker",
        "message_type": "SERVICES_AVAILABLE",
        "payload": {},
        "conversation_id": "q1",
        "message_id": waiting.message_id,
    }
    # The payload may take the bound less the envelope around it (whose "{}" is its place).
    assert waiting.room == router.state.limits.max_discover_bytes - len(orjson.dumps(envelope)) + 2
    world_frames = frames(router.to_lobby.answered(waiting, b'{"services":[]}'))
    assert world_frames == [{**envelope, "payload": {"services": []}}]
    raw(router, asker.session, auth_token=asker.token, **discover)
    waiting = router.to_lobby.take_query()
    assert waiting is not None
    (error,) = frames(router.to_lobby.answered(waiting, None, "the cursor is not one of mine"))
    assert error["payload"] == {
        "code": "malformed",
        "error": "the cursor is not one of mine",
        "original_message_type": "DISCOVER_SERVICES",
        "original_conversation_id": None,
    }
    raw(router, asker.session, auth_token=asker.token, **discover)
    waiting = router.to_lobby.take_query()
    assert waiting is not None
    router.close(asker.session)
    assert router.to_lobby.answered(waiting, b'{"services":[]}') == []
    assert waiting.agent.queries_waiting == 0
