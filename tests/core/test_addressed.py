"""Capability-addressed REQUESTs, synchronously through the Router: the choice of provider,
the refusals, and failover when the provider's connection closes (lobby/core/addressed.py)."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from lobby.core import Router
from lobby.core.addressed_parts import Addressed
from lobby.core.session import Close
from protocol.models import CloseCode
from tests.routerkit import Peer, cap, join, make_router, world

SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
CHEAP = {"attribute": "price", "value": 1}


def call(peer: Peer, conversation: str = "k", **payload: Any) -> None:
    peer.send("REQUEST", {"capability_name": "quote", **payload}, conversation_id=conversation)


def providers(router: Router, *ids: str, **capability: Any) -> list[Peer]:
    return [join(router, agent_id, capabilities=[cap("quote", **capability)]) for agent_id in ids]


def receiver(*peers: Peer) -> str:
    """The one of `peers` that received a message since last asked; its inbox emptied."""
    got = [p for p in peers if p.inbox]
    assert len(got) == 1, [p.agent_id for p in got]
    got[0].take()
    return got[0].agent_id


def refusal(peer: Peer) -> tuple[str, str, Any]:
    """The lobby's final RESPONSE to `peer`'s REQUEST: (message type, code, error)."""
    answer = peer.last()
    return answer["message_type"], answer["payload"]["code"], answer["payload"]["error"]


def test_the_provider_gets_a_direct_request_and_its_response_names_it() -> None:
    router = make_router()
    (bob,) = providers(router, "bob")
    alice = join(router, "alice")
    alice.send(
        "REQUEST",
        {"capability_name": "quote", "arguments": {"n": 1}},
        conversation_id="k",
        message_id="m-1",
    )
    (delivered,) = bob.take()
    assert delivered["sender_id"] == "alice"
    assert delivered["receiver_id"] == "bob"
    assert delivered["message_id"] == "m-1"
    assert delivered["payload"] == {"capability_name": "quote", "n": 1}
    assert "redelivered" not in delivered
    assert router.conversations == {("alice", "bob", "k"): 1}
    assert router.registry.agents["bob"].serving == 1
    bob.to("alice", "RESPONSE", {"status": "success", "price": 3}, conversation_id="k")
    (reply,) = alice.take()
    assert (reply["sender_id"], reply["payload"]) == ("bob", {"status": "success", "price": 3})
    assert router.conversations == {}
    assert router.registry.agents["bob"].serving == 0
    assert router.addressed.pending == {}
    assert router.addressed.queued == {}


def test_the_object_form_reaches_a_capability_that_asks_for_it() -> None:
    router = make_router()
    bob = join(router, "bob", capabilities=[cap("quote", arguments_form="object")])
    alice = join(router, "alice")
    call(alice, arguments={"n": 1})
    assert bob.last()["payload"] == {"capability_name": "quote", "arguments": {"n": 1}}


def test_calls_go_to_the_fewest_outstanding_then_in_turn() -> None:
    router = make_router()
    bob, carol, dave = providers(router, "bob", "carol", "dave")
    alice = join(router, "alice")
    order = []
    for n in range(6):
        call(alice, f"k{n}")
        order.append(receiver(bob, carol, dave))
    assert order == ["bob", "carol", "dave", "bob", "carol", "dave"]
    # carol answers both of hers: she now serves the fewest, and gets the next two.
    carol.to("alice", "RESPONSE", {"status": "success"}, conversation_id="k1")
    carol.to("alice", "RESPONSE", {"status": "success"}, conversation_id="k4")
    alice.take()
    call(alice, "k6")
    assert receiver(bob, carol, dave) == "carol"
    call(alice, "k7")
    assert receiver(bob, carol, dave) == "carol"
    call(alice, "k8")  # all at two now: in turn after carol
    assert receiver(bob, carol, dave) == "dave"


def test_who_is_never_chosen() -> None:
    router = make_router()
    pricey = cap("quote", attributes={"price": 9})
    closed = join(
        router, "closed", capabilities=[cap("quote", ["someone_else"], attributes={"price": 9})]
    )
    cheap = join(router, "cheap", capabilities=[cap("quote", attributes={"price": 1})])
    offline = join(router, "offline", capabilities=[pricey])
    router.close(offline.session)
    alice = join(router, "alice", capabilities=[pricey])  # the requester itself
    chosen = join(router, "chosen", capabilities=[pricey])
    for n in range(3):
        call(alice, f"k{n}", filters=[{"attribute": "price", "op": "gt", "value": 5}])
        assert receiver(closed, cheap, offline, alice, chosen) == "chosen"


def test_no_candidate_is_answered_no_provider() -> None:
    router = make_router()
    alice = join(router, "alice", capabilities=[cap("quote")])
    call(alice)
    assert refusal(alice) == (
        "RESPONSE",
        "no_provider",
        "no online agent offers capability 'quote' to 'alice'",
    )
    providers(router, "bob", attributes={"price": 1})
    call(alice, filters=[{"attribute": "price", "value": 2}])
    reply = alice.last()
    assert (reply["sender_id"], reply["conversation_id"]) == ("global_lobby", "k")
    assert reply["payload"] == {
        "status": "error",
        "code": "no_provider",
        "error": "no online agent offers capability 'quote' to 'alice' matching the filters",
    }
    assert router.conversations == {}
    assert router.counters.refused["no_provider"] == 2


@pytest.mark.parametrize(
    ("payload", "error"),
    [
        (
            {"arguments": {}, "receiver": "x"},
            "a REQUEST to 'global_lobby' has unknown field 'receiver' "
            "(fields: capability_name, arguments, filters)",
        ),
        ({"arguments": [1]}, "a REQUEST to 'global_lobby' needs 'arguments' to be an object"),
        (
            {"filters": [{"attribute": "price", "op": "like", "value": 1}]},
            "invalid REQUEST filters: filters[0] has unknown op 'like' "
            "(one of eq, ne, lt, le, gt, ge, in, contains)",
        ),
        (
            {"filters": [{"attribute": "price", "value": n} for n in range(9)]},
            "invalid REQUEST filters: at most 8 filters, not 9",
        ),
        (
            {"filters": {"price": 1}},
            "invalid REQUEST filters: 'filters' must be a list of {attribute, op, value} objects",
        ),
    ],
)
def test_a_malformed_payload_is_refused_and_changes_nothing(
    payload: dict[str, Any], error: str
) -> None:
    router = make_router()
    (bob,) = providers(router, "bob")
    alice = join(router, "alice")
    call(alice, **payload)
    answer = alice.last()
    assert answer["message_type"] == "ERROR"
    assert (answer["payload"]["code"], answer["payload"]["error"]) == ("malformed", error)
    assert bob.take() == []
    assert router.conversations == {}


def test_a_schema_refusal_passes_the_candidate_over_and_all_refusing_is_invalid_input() -> None:
    router = make_router()
    strict = join(router, "strict", capabilities=[cap("quote", input_schema=SCHEMA)])
    alice = join(router, "alice")
    call(alice, arguments={"n": "one"})
    answer = alice.last()
    assert answer["payload"]["code"] == "invalid_input"
    assert answer["payload"]["path"] == "/n"
    assert answer["payload"]["error"].startswith(
        "Invalid input for capability 'quote' on agent 'strict' at /n: "
    )
    (lax,) = providers(router, "lax")
    call(alice, "k2", arguments={"n": "one"})
    assert receiver(strict, lax) == "lax"
    call(alice, "k3", arguments={"n": 1})
    assert receiver(strict, lax) == "strict"


@pytest.mark.parametrize(
    ("why", "capability", "payload", "code"),
    [
        ("offline", {}, {}, "no_provider"),
        ("the requester", {}, {}, "no_provider"),
        ("not allowed", {"authorized": ["carol"]}, {}, "no_provider"),
        ("filtered out", {"attributes": {"price": 9}}, {"filters": [CHEAP]}, "no_provider"),
        ("refusing", {"input_schema": SCHEMA}, {"arguments": {"n": "one"}}, "invalid_input"),
        ("accepting", {"input_schema": SCHEMA}, {"arguments": {"n": 1}}, None),
    ],
)  # fmt: skip
def test_a_sole_provider_is_given_only_what_it_may_take(
    why: str, capability: dict[str, Any], payload: dict[str, Any], code: str | None
) -> None:
    """One provider is looked at once, without ranking (`Addressing.request`): the same rules."""
    router = make_router()
    sole = join(router, "sole", capabilities=[cap("quote", **capability)])
    alice = sole if why == "the requester" else join(router, "alice")
    if why == "offline":
        router.close(sole.session)
    call(alice, **payload)
    if code is None:
        assert sole.last()["payload"] == {"capability_name": "quote", "n": 1}
        assert router.conversations == {("alice", "sole", "k"): 1}
        return
    answer = alice.last()
    assert (answer["sender_id"], answer["payload"]["code"]) == ("global_lobby", code)
    assert router.conversations == {}
    assert sole.inbox == []


def test_a_duplicate_is_confirmed_not_dispatched_again() -> None:
    router = make_router()
    bob, carol = providers(router, "bob", "carol")
    alice = join(router, "alice")
    for _ in range(2):
        alice.send("REQUEST", {"capability_name": "quote"}, conversation_id="k", message_id="m")
    assert len(bob.take()) + len(carol.take()) == 1
    assert router.conversations == {("alice", "bob", "k"): 1}


def resume(router: Router, peer: Peer) -> Peer:
    """`peer` registers again on a new connection, with its token."""
    session = router.open(peer.agent_id)
    frame = {
        "sender_id": peer.agent_id,
        "receiver_id": "global_lobby",
        "message_type": "REGISTER",
        "payload": {},
        "auth_token": peer.token,
    }
    router.handle(session, orjson.dumps(frame))
    again = Peer(router, peer.agent_id, session, peer.token)
    world.peers[session.id] = again
    return again


def fail_over(router: Router, provider: Peer, how: str) -> list[Any]:
    if how == "close":
        return router.close(provider.session, 1006)
    if how == "unregister":
        frame = {
            "sender_id": provider.agent_id,
            "receiver_id": "global_lobby",
            "message_type": "UNREGISTER",
            "payload": {},
            "auth_token": provider.token,
        }
        actions = router.handle(provider.session, orjson.dumps(frame))
        assert any(isinstance(a, Close) for a in actions)
        return actions
    return router.revoke(provider.agent_id, remove=True) or []


@pytest.mark.parametrize("sole", [False, True], ids=["two-providers", "sole-provider-then-two"])
@pytest.mark.parametrize("how", ["close", "unregister", "remove"])
def test_a_provider_gone_before_its_answer_fails_over(how: str, sole: bool) -> None:
    """`sole`: bob was the only provider when the REQUEST was given (kept as a `Given`
    tuple), carol offers the capability only after."""
    router = make_router()
    (bob,) = providers(router, "bob", acks=True)
    if not sole:
        (carol,) = providers(router, "carol", acks=True)
    alice = join(router, "alice")
    alice.send("REQUEST", {"capability_name": "quote"}, conversation_id="k", message_id="m-1")
    (first,) = bob.take()
    if sole:
        assert type(router.addressed.pending["alice", "bob", "k"]) is tuple
        (carol,) = providers(router, "carol", acks=True)
    world.deliver(fail_over(router, bob, how))
    (again,) = carol.take()
    assert again["redelivered"] is True
    assert (again["message_id"], again["sender_id"], again["receiver_id"]) == (
        "m-1",
        "alice",
        "carol",
    )
    assert again["payload"] == first["payload"]
    assert router.conversations == {("alice", "carol", "k"): 1}
    if how == "close":  # the copy held for bob (it acknowledges) is dropped
        assert list(router.registry.agents["bob"].mailbox) == []
    carol.to("alice", "RESPONSE", {"status": "success"}, conversation_id="k")
    assert alice.last()["sender_id"] == "carol"
    assert router.registry.agents["alice"].open_requests == 0


@pytest.mark.parametrize("first_form", ["flat", "object"])
def test_a_failover_from_a_sole_provider_gives_the_next_the_same_arguments_in_its_form(
    first_form: str,
) -> None:
    """What a sole provider was given is kept as its frame (`Given`): the arguments read back
    from it reach the next provider whole, in that provider's own form."""
    router = make_router()
    bob = join(router, "bob", capabilities=[cap("quote", arguments_form=first_form)])
    alice = join(router, "alice")
    arguments = {"n": 1, "item": {"sku": "b-7", "tags": ["x"]}, "arguments": "a field too"}
    call(alice, arguments=arguments)
    assert type(router.addressed.pending["alice", "bob", "k"]) is tuple
    second = "object" if first_form == "flat" else "flat"
    carol = join(router, "carol", capabilities=[cap("quote", arguments_form=second)])
    world.deliver(router.close(bob.session, 1006))
    (again,) = carol.take()
    assert again["redelivered"] is True
    if second == "object":
        assert again["payload"] == {"capability_name": "quote", "arguments": arguments}
    else:
        assert again["payload"] == {"capability_name": "quote", **arguments}


def test_the_old_providers_late_response_is_refused() -> None:
    router = make_router()
    bob, carol = providers(router, "bob", "carol")
    alice = join(router, "alice")
    call(alice)
    bob.take()
    world.deliver(router.close(bob.session, 1006))
    carol.take()
    again = resume(router, bob)
    again.to("alice", "RESPONSE", {"status": "success"}, conversation_id="k")
    error = again.last()
    assert (error["message_type"], error["payload"]["code"]) == ("ERROR", "unknown_conversation")
    assert alice.take() == []


def test_no_candidate_left_is_answered_no_provider_even_to_an_offline_requester() -> None:
    router = make_router()
    bob, carol = providers(router, "bob", "carol")
    alice = join(router, "alice", acks=True)
    call(alice)
    router.close(alice.session)
    holder = receiver(bob, carol)
    first = bob if holder == "bob" else carol
    second = carol if first is bob else bob
    world.deliver(router.close(first.session, 1006))
    assert second.take()[0]["redelivered"] is True
    world.deliver(router.close(second.session, 1006))
    assert router.conversations == {}
    (held,) = [frame for _, frame in router.registry.agents["alice"].mailbox]
    assert b'"code":"no_provider"' in held
    assert b'"sender_id":"global_lobby"' in held
    assert router.registry.agents["alice"].open_requests == 0


def test_a_replaced_connection_does_not_fail_over() -> None:
    router = make_router()
    bob, carol = providers(router, "bob", "carol")
    alice = join(router, "alice")
    call(alice)
    bob.take()
    resume(router, bob)  # the old connection is closed with 4001
    assert router.close(bob.session, CloseCode.REPLACED) == []
    assert carol.take() == []
    assert router.conversations == {("alice", "bob", "k"): 1}


def test_a_stopping_lobby_or_a_move_to_another_node_does_not_fail_over() -> None:
    router = make_router()
    bob, carol = providers(router, "bob", "carol")
    alice = join(router, "alice")
    call(alice)
    bob.take()
    assert router.close(bob.session, CloseCode.SERVICE_RESTART) == []
    router.addressed.paused = True  # as `LobbyServer.stop` sets it
    call(alice, "k2")
    assert receiver(bob, carol) == "carol"
    assert router.close(carol.session, 1001) == []
    assert router.conversations == {("alice", "bob", "k"): 1, ("alice", "carol", "k2"): 1}


def test_several_in_one_conversation_each_wait_for_their_own_answer_and_fail_over() -> None:
    router = make_router()
    (bob,) = providers(router, "bob")
    alice = join(router, "alice")
    for n in range(3):
        alice.send("REQUEST", {"capability_name": "quote"}, conversation_id="k", message_id=f"m{n}")
    assert len(bob.take()) == 3
    assert router.conversations == {("alice", "bob", "k"): 3}
    bob.to("alice", "RESPONSE", {"status": "success"}, conversation_id="k", in_reply_to="m0")
    alice.take()
    (carol,) = providers(router, "carol")
    world.deliver(router.close(bob.session, 1006))
    assert [m["message_id"] for m in carol.take()] == ["m1", "m2"]
    assert router.conversations == {("alice", "carol", "k"): 2}
    key = ("alice", "carol", "k")
    redone = [router.addressed.pending[key], *router.addressed.queued[key]]
    assert all(isinstance(a, Addressed) for a in redone)  # a failover keeps whole records
    assert [a.message_id for a in redone if isinstance(a, Addressed)] == ["m1", "m2"]
    for _ in range(2):
        carol.to("alice", "RESPONSE", {"status": "success"}, conversation_id="k")
    assert router.addressed.pending == {}
    assert router.addressed.queued == {}
