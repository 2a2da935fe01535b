"""An operator's revoke and remove (`Router.revoke`), and the counters /metrics reads, on the
sans-I/O router: synchronously, as a function of its state."""

from __future__ import annotations

import hashlib
import uuid
from typing import Any

import orjson
from structlog.testing import capture_logs

from lobby.core import Router, Send
from lobby.core.records import AgentRemoved, AgentSaved
from lobby.core.session import REVOKED, Close
from tests.routerkit import join, make_router


def register(router: Router, agent_id: str, token: str | None = None) -> list[dict[str, Any]]:
    """REGISTER on a new connection: the frames it gets (its answer first)."""
    frame: dict[str, Any] = {
        "sender_id": agent_id,
        "receiver_id": "global_lobby",
        "message_type": "REGISTER",
        "payload": {},
        "auth_token": token,
    }
    actions = router.handle(router.open(), orjson.dumps(frame))
    return [orjson.loads(a.frame) for a in actions if isinstance(a, Send)]


def test_revoke_closes_with_4003_journals_and_lets_a_tokenless_register_take_the_id() -> None:
    router = make_router()
    seller = join(router, "seller")
    buyer = join(router, "buyer")
    router.delivery.take_journal()
    (close,) = router.revoke("seller") or []
    assert isinstance(close, Close)
    assert (close.session, close.code, close.reason) == (
        seller.session,
        4003,
        "token revoked by an operator",
    )
    (saved,) = router.delivery.take_journal().records
    assert isinstance(saved, AgentSaved)
    assert (saved.agent_id, saved.token_hash) == ("seller", REVOKED)
    # Held for the id meanwhile.
    buyer.to("seller", "TEXT", {"content": "hi"})
    assert buyer.take() == []
    (refused,) = register(router, "seller", seller.token)
    assert refused["payload"]["code"] == "agent_id_taken"
    assert refused["payload"]["error"] == (
        "the auth_token of agent 'seller' was revoked by an operator: "
        "REGISTER without auth_token to get a new one"
    )
    fresh, held = register(router, "seller")
    assert fresh["payload"]["status"] == "success_registered_finalized"
    assert fresh["payload"]["auth_token"] != seller.token
    assert uuid.UUID(fresh["payload"]["auth_token"]).version == 4
    assert (held["message_type"], held["payload"]) == ("TEXT", {"content": "hi"})
    assert router.registry.agents["seller"].token_hash != REVOKED
    # A second revoke of an offline agent closes nothing.
    router.registry.agents["seller"].session = None
    assert router.revoke("seller") == []


def test_remove_drops_the_agent_and_journals_it() -> None:
    router = make_router()
    seller = join(router, "seller")
    router.delivery.take_journal()
    (close,) = router.revoke("seller", remove=True) or []
    assert isinstance(close, Close)
    assert (close.code, close.reason) == (4003, "removed by an operator")
    assert seller.session.agent is None
    assert "seller" not in router.registry.agents
    assert router.delivery.take_journal().records == [AgentRemoved("seller")]
    assert router.revoke("seller") is None
    assert router.revoke("nobody", remove=True) is None


def test_revoke_and_remove_are_logged_as_what_they_did() -> None:
    router = make_router()
    join(router, "seller")
    join(router, "buyer")
    with capture_logs() as logs:
        router.revoke("seller")
        router.revoke("buyer", remove=True)
    assert [(e["event"], e["agent_id"]) for e in logs] == [
        ("AGENT_TOKEN_REVOKED", "seller"),
        ("AGENT_REMOVED", "buyer"),
    ]


def test_counters_count_routed_messages_by_type_and_refusals_by_code() -> None:
    router = make_router()
    seller = join(router, "seller", capabilities=[{"name": "price"}])
    buyer = join(router, "buyer")
    buyer.to("seller", "REQUEST", {"capability_name": "price"}, conversation_id="c")
    seller.to("buyer", "RESPONSE", {"status": "success"}, conversation_id="c")
    buyer.to("seller", "REQUEST", {"capability_name": "price"}, conversation_id="e")
    seller.to("buyer", "RESPONSE", {"status": "success"}, conversation_id="e")
    buyer.to("seller", "TEXT", {"content": "hi"})
    buyer.to("seller", "TEXT", {"content": "again"})
    buyer.to("seller", "REQUEST", {"capability_name": "nope"}, conversation_id="d")
    buyer.to("nobody", "TEXT", {"content": "hi"})
    counted = router.counters.by_type()
    assert (counted["REQUEST"], counted["RESPONSE"], counted["TEXT"]) == (2, 2, 2)
    refused = router.counters.refused
    assert (refused["capability_not_found"], refused["unknown_receiver"]) == (1, 1)
    assert sum(refused.values()) == 2


def test_taking_a_revoked_id_over_is_logged_and_journaled_as_a_registration() -> None:
    router = make_router()
    seller = join(router, "seller")
    router.revoke("seller")
    router.delivery.take_journal()
    with capture_logs() as logs:
        (fresh,) = register(router, "seller")
    assert (fresh["receiver_id"], fresh["payload"]["status"]) == (
        "seller",
        "success_registered_finalized",
    )
    assert [(e["event"], e["agent_id"]) for e in logs] == [("AGENT_REGISTERED", "seller")]
    (saved,) = router.delivery.take_journal().records
    assert isinstance(saved, AgentSaved)
    assert saved.token_hash == hashlib.sha256(fresh["payload"]["auth_token"].encode()).digest()
    assert seller.token != fresh["payload"]["auth_token"]
