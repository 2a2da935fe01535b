"""The core's side of the registry cluster nodes share (`Router.share`), driven synchronously:
a new id waits for the shared registry's verdict, changes are queued for it, and what other
nodes registered is known here without being journaled."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from structlog.testing import capture_logs

from lobby.cluster.keys import agent_id_of, agent_key, decode_agent, encode_agent
from lobby.core import Router, Send
from lobby.core.cluster import shared as shared_module
from lobby.core.cluster.shared import FAILOVER_HOLD
from lobby.core.limits import Limits
from lobby.core.records import AgentRemoved, AgentSaved
from lobby.core.refusal import hash_token
from lobby.core.session import Action, Close, Session
from tests.routerkit import Clock, Peer, cap, frames, join, make_router, raw, world


def register(router: Router, agent_id: str, **payload: Any) -> tuple[Session, list[Action]]:
    session = router.open(agent_id)
    sent = raw(router, session, sender_id=agent_id, message_type="REGISTER", payload=payload)
    return session, sent


def test_a_new_id_is_answered_only_after_the_shared_registry_created_it() -> None:
    router = make_router()
    shared = router.share("here")
    session, sent = register(router, "seller.7", capabilities=[cap("quote")])
    assert sent == []  # no REGISTER_ACK yet
    assert router.registry.get("seller.7") is None
    (claim,), changes = shared.take()
    assert changes == []
    assert claim.saved.agent_id == "seller.7"
    assert [c["name"] for c in orjson.loads(claim.saved.capabilities)] == ["quote"]
    (ack,) = frames(router.claimed("seller.7", True))
    assert ack["message_type"] == "REGISTER_ACK"
    token = ack["payload"]["auth_token"]
    assert claim.saved.token_hash == hash_token(token)  # the shared store gets the hash only
    assert token.encode() not in claim.saved.capabilities
    record = router.registry.get("seller.7")
    assert record is not None
    assert record.session is session
    assert any(isinstance(r, AgentSaved) for r in router.take_journal().records)


def test_a_claim_lost_to_another_node_is_agent_id_taken_and_changes_nothing() -> None:
    router = make_router()
    shared = router.share("here")
    session, _ = register(router, "x")
    _, again = register(router, "x")  # a second connection while the first waits
    assert frames(again)[0]["payload"]["code"] == "agent_id_taken"
    shared.take()
    (error,) = frames(router.claimed("x", False))
    assert error["payload"]["code"] == "agent_id_taken"
    assert error["payload"]["original_message_type"] == "REGISTER"
    assert "another node" in error["payload"]["error"]
    assert router.registry.get("x") is None
    assert session.agent is None
    assert router.take_journal().records == []
    register(router, "y")
    shared.take()
    assert frames(router.claimed("y", None))[0]["payload"]["code"] == "internal"


def test_a_claim_whose_connection_closed_registers_the_agent_offline() -> None:
    router = make_router()
    router.share("here")
    session, _ = register(router, "x")
    router.close(session)
    assert router.claimed("x", True) == []
    record = router.registry.get("x")
    assert record is not None
    assert record.session is None


def test_what_other_nodes_registered_is_discovered_here_and_not_journaled() -> None:
    router = make_router()
    router.share("here")
    me = join_shared(router, "me")
    capabilities = orjson.dumps([cap("translate")])
    assert router.learned(AgentSaved("far", hash_token("t"), capabilities, True), "there") == []
    assert router.take_journal().records == []
    me.send("DISCOVER_SERVICES", {})
    answer = me.last()["payload"]["services_found"]
    assert [s["agent_id"] for s in answer] == ["far"]
    assert answer[0]["online"] is False  # online only on the node holding its connection
    assert router.forgot("far") == []
    assert router.registry.get("far") is None
    assert router.take_journal().records == [AgentRemoved("far")]


def test_changes_made_here_are_queued_for_the_shared_registry() -> None:
    router = make_router()
    shared = router.share("here")
    me = join_shared(router, "me")
    me.send("UPDATE_CAPABILITIES", {"capabilities": [cap("a")]})
    me.send("UNREGISTER", {})
    _, changes = shared.take()
    assert [type(c) for c in changes] == [AgentSaved, AgentRemoved]
    assert isinstance(changes[0], AgentSaved)
    assert orjson.loads(changes[0].capabilities)[0]["name"] == "a"


def test_a_token_replaced_elsewhere_closes_the_connection_here() -> None:
    router = make_router()
    router.share("here")
    me = join_shared(router, "me")
    (close,) = router.learned(AgentSaved("me", hash_token("other"), b"[]", False), "here")
    assert isinstance(close, Close)
    assert close.session is me.session
    assert close.code == 4003


def test_kv_keys_encode_every_agent_id_reversibly() -> None:
    for agent_id in ("seller.7", "a:b@c", "under_score", "-x-", "a..b", "Z9"):
        key = agent_key(agent_id)
        assert all(c.isalnum() or c in "-_" for c in key)
        assert agent_id_of(key) == agent_id
    assert agent_key("seller.7") == "seller_2e7"
    saved = AgentSaved("a", hash_token("t"), orjson.dumps([cap("c")]), True)
    assert decode_agent("a", encode_agent(saved, "n1")) == (saved, "n1")


def join_shared(router: Router, agent_id: str, **payload: Any) -> Peer:
    """REGISTER on a node whose claim the shared registry grants; its journal and queue
    taken."""
    session, _ = register(router, agent_id, **payload)
    assert router.state.shared is not None
    router.state.shared.take()
    (ack,) = frames(router.claimed(agent_id, True))
    router.take_journal()
    peer = Peer(router, agent_id, session, ack["payload"]["auth_token"])
    world.peers[session.id] = peer
    return peer


def test_a_resume_on_another_node_closes_the_connection_here_with_4001() -> None:
    router = make_router()
    shared = router.share("here")
    me = join_shared(router, "me")
    saved = AgentSaved("me", me.session.agent.token_hash, b"[]", False)  # type: ignore[union-attr]
    assert router.learned(saved, "here") == []  # its home is still this node
    (close,) = router.learned(saved, "there")
    assert isinstance(close, Close)
    assert close.session is me.session
    assert close.code == 4001
    record = router.registry.get("me")
    assert record is not None
    assert record.session is None
    # It resumes here again: saved (and so shared) even with nothing else changed.
    again = router.open("me")
    resume = {"capabilities": None}
    raw(router, again, sender_id="me", message_type="REGISTER", payload=resume, auth_token=me.token)
    # Its home is node "there": the resume waits until "there" is known up.
    assert record.session is None
    assert shared.probes == ["there"]
    assert router.probed("there", alive=True) == []  # then "there" hands it over
    assert shared.releases == [("there", "me")]
    actions = router.handed_over("there", "me", b"")
    assert [frame["message_type"] for frame in frames(actions)] == ["REGISTER_ACK"]
    assert record.session is again
    _, changes = shared.take()
    assert [c.agent_id for c in changes] == ["me"]


# The rules of `SharedRegistry` one by one: claims, verdicts, what other nodes changed.


def test_a_second_claim_of_a_waiting_id_is_refused_with_its_sentence() -> None:
    router = make_router()
    shared = router.share("here")
    first, _ = register(router, "x")
    _, again = register(router, "x")
    (error,) = frames(again)
    assert error["payload"]["code"] == "agent_id_taken"
    assert error["payload"]["error"] == "agent id 'x' is being registered by another connection"
    claims, _ = shared.take()  # the second claim queued nothing
    assert [c.session for c in claims] == [first]
    assert list(shared.claims) == ["x"]
    assert shared.take() == ([], [])


def test_a_closed_connection_leaves_the_other_connections_claims_answered() -> None:
    router = make_router()
    router.share("here")
    gone, _ = register(router, "x")
    waiting, _ = register(router, "y")
    router.close(gone)
    (ack,) = router.claimed("y", True)
    assert isinstance(ack, Send)
    assert ack.session is waiting
    assert orjson.loads(ack.frame)["message_type"] == "REGISTER_ACK"
    assert router.claimed("x", True) == []
    x, y = router.registry.get("x"), router.registry.get("y")
    assert x is not None
    assert y is not None
    assert (x.session, y.session) == (None, waiting)


def test_a_won_claim_registers_what_the_register_asked() -> None:
    limits = Limits(message_rate=5, registration_rate=0, discover_rate=0)
    router = Router(limits=limits, clock=Clock())
    shared = router.share("here")
    register(router, "x", capabilities=[cap("quote"), cap("sell")], acks=True)
    (claim,), _ = shared.take()
    assert claim.bucket is not None
    router.claimed("x", True)
    record = router.registry.get("x")
    assert record is not None
    assert (record.acks, record.bucket, record.home) == (True, claim.bucket, None)
    assert record.token_hash == claim.saved.token_hash
    assert sorted(record.capabilities) == ["quote", "sell"]
    assert shared.claims == {}


def test_a_lost_claim_leaves_the_registry_as_it_was() -> None:
    router = make_router()
    shared = router.share("here")
    register(router, "x", capabilities=[cap("quote")])
    claim, record = shared.claimed("x", False)
    assert (claim.saved.agent_id, record) == ("x", None)
    assert router.registry.get("x") is None
    assert shared.claims == {}


def test_an_id_known_already_when_the_claim_is_won_is_logged_and_replaced() -> None:
    router = make_router()
    router.share("here")
    register(router, "x", acks=True)
    router.learned(AgentSaved("x", hash_token("old"), orjson.dumps([cap("old")]), False), "far")
    with capture_logs() as logs:
        router.claimed("x", True)
    assert [e["event"] for e in logs] == ["CLUSTER_REGISTRY_STALE", "AGENT_REGISTERED"]
    assert (logs[0]["agent_id"], logs[0]["log_level"]) == ("x", "warning")
    record = router.registry.get("x")
    assert record is not None
    assert (record.acks, list(record.capabilities), record.home) == (True, [], None)
    assert record.token_hash != hash_token("old")


def test_an_agent_learned_from_another_node_keeps_its_acks_capabilities_and_home() -> None:
    router = make_router()
    router.share("here")
    capabilities = orjson.dumps([cap("quote"), cap("sell")])
    assert router.learned(AgentSaved("far", hash_token("t"), capabilities, True), "there") == []
    record = router.registry.get("far")
    assert record is not None
    assert (record.token_hash, record.acks, record.home) == (hash_token("t"), True, "there")
    assert sorted(record.capabilities) == ["quote", "sell"]
    # A later change of the same agent: replaced, not added to; written here means home here.
    changed = AgentSaved("far", hash_token("t"), orjson.dumps([cap("lend")]), False)
    assert router.learned(changed, "here") == []
    assert router.registry.get("far") is record
    assert (record.acks, record.home, list(record.capabilities)) == (False, None, ["lend"])


def test_a_change_written_by_this_node_closes_nothing_and_keeps_the_connection() -> None:
    router = make_router()
    router.share("here")
    me = join_shared(router, "me")
    assert me.session.agent is not None
    saved = AgentSaved("me", me.session.agent.token_hash, orjson.dumps([cap("a")]), True)
    with capture_logs() as logs:
        assert router.learned(saved, "here") == []
    assert logs == []
    record = router.registry.get("me")
    assert record is not None
    assert (record.session, me.session.agent, record.acks) == (me.session, record, True)
    assert list(record.capabilities) == ["a"]


def test_a_token_replaced_elsewhere_revokes_the_connection_here_and_forgets_it() -> None:
    router = make_router()
    router.share("here")
    me = join_shared(router, "me")
    record = router.registry.get("me")
    assert record is not None
    (close,) = router.learned(AgentSaved("me", hash_token("other"), b"[]", False), "there")
    assert close == Close(me.session, 4003, "token revoked")
    assert (record.session, me.session.agent) == (None, None)
    assert (record.token_hash, record.home) == (hash_token("other"), "there")
    # Offline, a new token closes nothing.
    assert router.learned(AgentSaved("me", hash_token("third"), b"[]", False), "there") == []
    assert record.token_hash == hash_token("third")


def test_a_resume_on_another_node_is_logged_and_says_which_node() -> None:
    router = make_router()
    router.share("here")
    me = join_shared(router, "me")
    assert me.session.agent is not None
    saved = AgentSaved("me", me.session.agent.token_hash, b"[]", False)
    with capture_logs() as logs:
        (close,) = router.learned(saved, "n2")
    assert close == Close(me.session, 4001, "replaced by a newer connection on node n2")
    assert me.session.agent is None
    assert [(e["event"], e["agent_id"], e["node_id"]) for e in logs] == [
        ("AGENT_MOVED", "me", "n2")
    ]
    record = router.registry.get("me")
    assert record is not None
    assert record.home == "n2"
    assert router.learned(saved, "n3") == []  # offline here: nothing more to close


def test_an_agent_removed_elsewhere_is_closed_here_as_unregistered() -> None:
    router = make_router()
    router.share("here")
    me = join_shared(router, "me")
    assert router.forgot("me") == [Close(me.session, 4003, "unregistered")]
    assert me.session.agent is None
    assert router.registry.get("me") is None
    assert router.take_journal().records == [AgentRemoved("me")]
    # An id this node never knew: nothing to close, nothing journaled.
    assert router.forgot("nobody") == []
    assert router.take_journal().records == []


def test_a_resume_of_an_agent_whose_home_is_down_waits_and_is_closed_with_1013_in_time() -> None:
    """Its home failed its probe: the resume is held for the failover (no answer yet), and
    closed with 1013 (try again) once held `FAILOVER_HOLD` with the home still down."""
    clock = Clock()
    router = make_router(clock)
    shared = router.share("here")
    me = join_shared(router, "me")
    saved = AgentSaved("me", me.session.agent.token_hash, b"[]", True)  # type: ignore[union-attr]
    router.learned(saved, "gone")
    resume = {"capabilities": None, "acks": True}
    first, second = router.open("me"), router.open("me")
    for session in (first, second):
        raw(
            router,
            session,
            sender_id="me",
            message_type="REGISTER",
            payload=resume,
            auth_token=me.token,
        )
    assert shared.probes == ["gone"]  # one probe for both
    router.close(second)  # gone meanwhile: nothing to answer
    assert router.probed("gone", alive=False) == []  # held, not refused
    assert shared.registering(first)
    assert not shared.registering(second)
    # Known down now: the next resume waits too, without a probe.
    clock.now += 1
    third = router.open("me")
    assert (
        raw(
            router,
            third,
            sender_id="me",
            message_type="REGISTER",
            payload=resume,
            auth_token=me.token,
        )
        == []
    )
    assert shared.probes == ["gone"]
    assert router.tick() == []  # still within the hold
    clock.now += FAILOVER_HOLD - 1
    reason = "its home node gone is down and being failed over: try again"
    assert router.tick() == [Close(first, 1013, reason)]  # its hold is over, the third's not
    clock.now += 1
    assert router.tick() == [Close(third, 1013, reason)]
    assert shared.failing_over == {}
    assert router.registry.get("me").session is None  # type: ignore[union-attr]
    # A wrong token is refused as ever, never gated.
    fourth = router.open("me")
    (error,) = frames(
        raw(
            router,
            fourth,
            sender_id="me",
            message_type="REGISTER",
            payload=resume,
            auth_token="wrong",
        )
    )
    assert error["payload"]["code"] == "agent_id_taken"


def test_a_resume_run_again_after_its_wait_is_not_counted_twice_against_its_address() -> None:
    """One REGISTER a second from an address: the resume that waited for its home's failover
    spent its attempt when it came, and is not refused `rate_limited` when it goes ahead."""
    clock = Clock()
    limits = Limits(message_rate=0, registration_rate=1, registration_burst=1, discover_rate=0)
    router = Router(limits=limits, clock=clock)
    router.share("here")
    me = join_shared(router, "me")  # the address's one attempt of this second
    saved = AgentSaved("me", me.session.agent.token_hash, b"[]", True)  # type: ignore[union-attr]
    router.learned(saved, "gone")
    clock.now += 1  # one attempt again
    session = router.open("me")
    resume = {"capabilities": None, "acks": True}
    assert (
        raw(
            router,
            session,
            sender_id="me",
            message_type="REGISTER",
            payload=resume,
            auth_token=me.token,
        )
        == []
    )
    assert router.probed("gone", alive=False) == []  # held for the failover
    router.learned(saved, "here")  # failed over to this node
    (ack,) = frames(router.tick())
    assert ack["message_type"] == "REGISTER_ACK"
    assert ack["payload"]["status"] == "success_resumed"


def test_a_message_to_an_agent_not_learned_yet_waits_for_its_lookup_then_goes_on() -> None:
    """`fresh` registered on node n2 a moment ago, its entry not yet watched here: a TEXT and
    a REQUEST to it wait, the lookup is asked for once, and once the entry is learned they are
    forwarded to n2 in the order sent; a later one waits behind them even though `fresh` is
    known by then."""
    router = make_router()
    shared = router.share("here")
    me = join_shared(router, "me")
    me.to("fresh", "TEXT", {"content": "one"}, message_id="m1")
    me.to("fresh", "REQUEST", {"capability_name": "quote"}, conversation_id="k", message_id="m2")
    assert me.take() == []  # no ERROR: waiting
    assert shared.lookups == ["fresh"]
    assert shared.parked_count == 2
    shared.lookups.clear()
    capabilities = orjson.dumps([cap("quote")])
    router.learned(AgentSaved("fresh", hash_token("t"), capabilities, True), "n2")
    me.to("fresh", "TEXT", {"content": "three"}, message_id="m3")
    assert router.delivery.forwards == []
    assert shared.lookups == []  # looked up already
    assert router.looked_up("fresh") == []
    sent = [
        (home, receiver, message_id)
        for home, receiver, _, message_id, _, _ in router.delivery.forwards
    ]
    assert sent == [("n2", "fresh", "m1"), ("n2", "fresh", "m2"), ("n2", "fresh", "m3")]
    assert (shared.parked, shared.parked_count) == ({}, 0)
    router.delivery.forwards.clear()
    me.to("fresh", "TEXT", {"content": "four"}, message_id="m4")  # nothing waits: on at once
    assert [f[3] for f in router.delivery.forwards] == ["m4"]
    assert me.take() == []


def test_a_message_to_an_agent_no_node_holds_is_refused_after_its_lookup() -> None:
    router = make_router()
    shared = router.share("here")
    me, you = join_shared(router, "me"), join_shared(router, "you")
    gone = join_shared(router, "gone")
    gone.to("nobody", "TEXT", {"content": "hi"}, message_id="g1")
    me.to("nobody", "TEXT", {"content": "hi"}, message_id="m1")
    you.to("nobody", "TEXT", {"content": "hi"}, message_id="y1")
    router.close(gone.session)  # never confirmed: resent after it reconnects
    assert me.take() == []
    world.deliver(router.looked_up("nobody"))
    for peer, message_id in ((me, "m1"), (you, "y1")):
        (error,) = peer.take()
        assert error["message_type"] == "ERROR"
        assert error["payload"]["code"] == "unknown_receiver"
        assert error["in_reply_to"] == message_id
    assert gone.take() == []
    assert shared.parked_count == 0
    assert router.take_journal().records == []
    assert router.looked_up("nobody") == []  # nothing waits for it any more


def test_a_refusal_among_the_messages_that_waited_reaches_its_sender() -> None:
    router = make_router()
    router.share("here")
    me = join_shared(router, "me")
    me.to("fresh", "REQUEST", {"capability_name": "nope"}, conversation_id="k", message_id="m1")
    me.to("fresh", "TEXT", {"content": "then this"}, message_id="m2")
    router.learned(AgentSaved("fresh", hash_token("t"), orjson.dumps([cap("quote")]), True), "n2")
    world.deliver(router.looked_up("fresh"))
    (denied,) = me.take()
    assert denied["payload"]["code"] == "capability_not_found"
    assert [f[3] for f in router.delivery.forwards] == ["m2"]


def test_only_a_cluster_node_waits_and_never_for_a_response_or_past_its_bound(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    alone = make_router()
    me = join(alone, "me")
    me.to("nobody", "TEXT", {"content": "hi"})
    assert me.last()["payload"]["code"] == "unknown_receiver"  # one node: at once
    router = make_router()
    shared = router.share("here")
    me = join_shared(router, "me", capabilities=[cap("quote")])
    asker = join_shared(router, "asker")
    asker.to("me", "REQUEST", {"capability_name": "quote"}, conversation_id="k")
    router.forgot("asker")  # unregistered on another node meanwhile
    me.to("asker", "RESPONSE", {"status": "success"}, conversation_id="k")
    assert me.last()["payload"]["code"] == "unknown_receiver"  # a RESPONSE never waits
    monkeypatch.setattr(shared_module, "PARKED_MAX", 1)
    me.to("nobody", "TEXT", {"content": "held"})
    me.to("nobody", "TEXT", {"content": "refused"})
    assert me.last()["payload"]["code"] == "unknown_receiver"
    assert shared.parked_count == 1
