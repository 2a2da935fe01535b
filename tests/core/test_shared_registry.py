"""The core's side of the registry cluster nodes share (`Router.share`), driven synchronously:
a new id waits for the shared registry's verdict, changes are queued for it, and what other
nodes registered is known here without being journaled."""

from __future__ import annotations

from typing import Any

import orjson

from lobby.cluster.keys import agent_id_of, agent_key, decode_agent, encode_agent
from lobby.core import Router
from lobby.core.records import AgentRemoved, AgentSaved
from lobby.core.refusal import hash_token
from lobby.core.session import Action, Close, Session
from tests.routerkit import Peer, cap, frames, make_router, raw, world


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
    actions = router.probed("there", alive=True)
    assert [frame["message_type"] for frame in frames(actions)] == ["REGISTER_ACK"]
    assert record.session is again
    _, changes = shared.take()
    assert [c.agent_id for c in changes] == ["me"]


def test_a_resume_of_an_agent_whose_home_is_down_is_closed_with_1013() -> None:
    router = make_router()
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
    (close,) = router.probed("gone", alive=False)
    assert isinstance(close, Close)
    assert (close.session, close.code) == (first, 1013)
    assert "being failed over" in close.reason
    # Known down now: the next resume is closed at once, without a probe.
    third = router.open("me")
    (close,) = raw(
        router, third, sender_id="me", message_type="REGISTER", payload=resume, auth_token=me.token
    )
    assert isinstance(close, Close)
    assert close.code == 1013
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
