"""WATCH, UNWATCH and PRESENCE, synchronously through the Router (lobby/core/discovery/presence.py):
the snapshot, each event at once, what a watcher may see, the limits, and the cost when nobody
watches."""

from __future__ import annotations

from typing import Any

from lobby.core import Close
from lobby.core.router import Router
from protocol.presence import MAX_WATCHED_AGENTS, MAX_WATCHES
from tests.routerkit import Peer, cap, frames, join, make_router, raw, world


def presence(peer: Peer) -> list[tuple[Any, ...]]:
    """What `peer` received, as (watch, event, agent_id, online, capabilities) tuples."""
    return [
        (
            m["conversation_id"],
            m["payload"]["event"],
            m["payload"].get("agent_id"),
            m["payload"].get("online"),
            m["payload"].get("capabilities", m["payload"].get("count")),
        )
        for m in peer.take()
        if m["message_type"] == "PRESENCE"
    ]


def watch(peer: Peer, conversation_id: str = "w-1", **payload: Any) -> None:
    peer.send("WATCH", payload, conversation_id=conversation_id, message_id=f"m-{conversation_id}")


def test_capability_watch_snapshot_then_every_change_at_once() -> None:
    router = make_router()
    join(router, "b", capabilities=[cap("quote"), cap("zeta")])
    c = join(router, "c", capabilities=[cap("quote")])
    router.close(c.session)
    join(router, "d", capabilities=[cap("other")])
    me = join(router, "me", capabilities=[cap("quote")])  # never about itself
    watch(me, capability_name="quote")
    received = me.take()
    assert all(m["in_reply_to"] == "m-w-1" for m in received)
    assert [m["payload"] for m in received] == [
        {"agent_id": "b", "event": "snapshot", "online": True, "capabilities": ["quote", "zeta"]},
        {"agent_id": "c", "event": "snapshot", "online": False, "capabilities": ["quote"]},
        {"event": "snapshot_end", "count": 2},
    ]
    e = join(router, "e", capabilities=[cap("quote")])
    assert presence(me) == [("w-1", "online", "e", True, ["quote"])]
    join(router, "f", capabilities=[cap("other")])  # not offering it: not told
    assert presence(me) == []
    e.send("UPDATE_CAPABILITIES", {"capabilities": [cap("other")]})  # no longer offers it
    assert presence(me) == [("w-1", "capabilities_changed", "e", True, ["other"])]
    e.send("UPDATE_CAPABILITIES", {"capabilities": [cap("other"), cap("quote")]})
    assert presence(me) == [("w-1", "capabilities_changed", "e", True, ["other", "quote"])]
    e.send("UPDATE_CAPABILITIES", {"capabilities": [cap("other"), cap("quote")]})
    assert presence(me) == []  # the same declaration again changes nothing
    world.deliver(router.close(e.session))
    assert presence(me) == [("w-1", "offline", "e", False, ["other", "quote"])]
    # A resume of an offline agent is "online", with what it declares now.
    c2 = raw(
        router,
        router.open(),
        sender_id="c",
        message_type="REGISTER",
        auth_token=c.token,
        payload={"capabilities": [cap("quote", description="better")]},
    )
    assert frames(c2)[0]["message_type"] == "REGISTER_ACK"
    assert [f["payload"] for f in frames(c2)[1:]] == [
        {"agent_id": "c", "event": "online", "online": True, "capabilities": ["quote"]}
    ]


def test_agent_watch_and_removal() -> None:
    router = make_router()
    b = join(router, "b", capabilities=[cap("quote")])
    me = join(router, "me")
    watch(me, agent_ids=["b", "nobody-yet", "me", "b"])
    assert presence(me) == [
        ("w-1", "snapshot", "b", True, ["quote"]),
        ("w-1", "snapshot_end", None, None, 1),
    ]
    join(router, "nobody-yet")  # with no capabilities: still an agent watched by id
    assert presence(me) == [("w-1", "online", "nobody-yet", True, [])]
    b.send("UNREGISTER", {})
    assert presence(me) == [("w-1", "removed", "b", False, [])]


def test_a_resume_of_a_connected_agent_is_no_event_unless_its_capabilities_change() -> None:
    router = make_router()
    b = join(router, "b", capabilities=[cap("quote")])
    me = join(router, "me")
    watch(me, capability_name="quote")
    me.take()
    register = {"sender_id": "b", "message_type": "REGISTER", "auth_token": b.token}
    world.deliver(raw(router, router.open(), **register, payload={"capabilities": [cap("quote")]}))
    assert presence(me) == []  # replaced by its own reconnection: still online
    again = {"capabilities": [cap("quote"), cap("x")]}
    world.deliver(raw(router, router.open(), **register, payload=again))
    assert presence(me) == [("w-1", "capabilities_changed", "b", True, ["quote", "x"])]


def test_operator_revoke_and_remove() -> None:
    router = make_router()
    join(router, "b", capabilities=[cap("quote")])
    join(router, "c", capabilities=[cap("quote")])
    me = join(router, "me")
    watch(me, capability_name="quote")
    me.take()
    actions = router.revoke("b")
    assert actions is not None
    assert isinstance(actions[0], Close)
    assert [f["payload"]["event"] for f in frames(actions)] == ["offline"]
    actions = router.revoke("c", remove=True)
    assert actions is not None
    assert [f["payload"] for f in frames(actions)] == [
        {"agent_id": "c", "event": "removed", "online": False, "capabilities": []}
    ]


def test_unwatch_and_close_end_watches() -> None:
    router = make_router()
    me = join(router, "me")
    watch(me, "w-1", capability_name="quote")
    watch(me, "w-2", agent_ids=["b"])
    me.take()
    me.send("UNWATCH", {}, conversation_id="w-1")
    assert me.take() == []  # no answer
    join(router, "b", capabilities=[cap("quote")])
    assert presence(me) == [("w-2", "online", "b", True, ["quote"])]
    me.send("UNWATCH", {}, conversation_id="w-1")
    (error,) = me.take()
    assert error["payload"]["code"] == "unknown_conversation"
    assert error["payload"]["error"] == "no watch 'w-1' on this connection"
    router.close(me.session)
    assert router.state.presence.of_session == {}
    assert router.state.presence.by_agent == {}
    assert router.state.presence.by_capability == {}


def test_a_watch_replaced_by_its_conversation_id_and_the_limits() -> None:
    router = make_router()
    me = join(router, "me")
    for n in range(MAX_WATCHES):
        watch(me, f"w-{n}", capability_name=f"c{n}")
    me.take()
    watch(me, "w-0", capability_name="quote")  # replaces w-0: not a 17th
    assert presence(me) == [("w-0", "snapshot_end", None, None, 0)]
    assert "c0" not in router.state.presence.by_capability
    watch(me, "w-x", capability_name="quote")
    (error,) = me.take()
    assert error["payload"]["code"] == "limit_exceeded"
    assert error["payload"]["error"] == (
        "agent 'me' already holds 16 watches; UNWATCH one first (or reuse its conversation_id "
        "to replace it)"
    )
    ids = [f"a{n}" for n in range(MAX_WATCHED_AGENTS + 1)]
    me.send("UNWATCH", {}, conversation_id="w-1")
    watch(me, "w-y", agent_ids=ids)
    (error,) = me.take()
    assert error["payload"]["code"] == "malformed"
    assert "agent_ids" in error["payload"]["error"]
    assert "1000" in error["payload"]["error"]
    watch(me, "w-y", agent_ids=ids[:MAX_WATCHED_AGENTS])
    assert presence(me)[-1] == ("w-y", "snapshot_end", None, None, 0)


def test_malformed_watches_change_nothing() -> None:
    router = make_router()
    me = join(router, "me")
    cases: list[tuple[dict[str, Any], str]] = [
        ({}, "WATCH takes exactly one of 'capability_name' and 'agent_ids'"),
        (
            {"capability_name": "q", "agent_ids": ["b"]},
            "WATCH takes exactly one of 'capability_name' and 'agent_ids'",
        ),
        ({"agent_ids": []}, "agent_ids"),
        ({"capability_name": 3}, "capability_name"),
    ]
    for payload, problem in cases:
        me.send("WATCH", payload, conversation_id="w-1")
        (error,) = me.take()
        assert error["payload"]["code"] == "malformed", payload
        assert problem in error["payload"]["error"], error
    me.send("WATCH", {"capability_name": "q"})
    (error,) = me.take()
    assert error["payload"]["error"] == "WATCH needs a conversation_id: it names the watch"
    me.to("b", "WATCH", {"capability_name": "q"}, conversation_id="w-1")
    (error,) = me.take()
    assert error["payload"]["error"] == "WATCH must be addressed to 'global_lobby'"
    me.send("PRESENCE", {"event": "online"}, conversation_id="w-1")
    (error,) = me.take()
    assert error["payload"]["error"] == "PRESENCE is sent by the lobby only"
    assert router.state.presence.of_session == {}


def test_a_closing_watcher_is_told_nothing_and_nobody_watching_costs_nothing() -> None:
    router: Router = make_router()
    me = join(router, "me")
    watch(me, capability_name="quote")
    me.take()
    me.session.agent = None  # replaced: its connection is closing
    join(router, "b", capabilities=[cap("quote")])
    assert me.take() == []
    router.close(me.session)
    index = router.state.presence
    assert index.by_capability == {}
    assert index.by_agent == {}
    assert index.came_online(router.registry.agents["b"]) == []


def test_a_cluster_node_reports_its_agents_and_hears_of_the_others() -> None:
    router = make_router()
    me = join(router, "me")
    b = join(router, "b", capabilities=[cap("quote")])
    router.share("n1")  # (a new id is claimed in the shared registry first: joined before)
    watch(me, capability_name="quote")
    me.take()
    presence_index = router.state.presence
    world.deliver(router.close(b.session))
    assert presence(me) == [("w-1", "offline", "b", False, ["quote"])]
    assert presence_index.outgoing == [("b", False)]
    # Another node's agent: online there, then gone offline there.
    assert router.registry.agents["b"].session is None
    world.deliver(router.presence_heard("n2", [("b", True)]))
    assert presence(me) == [("w-1", "online", "b", True, ["quote"])]
    world.deliver(router.presence_heard("n2", [("b", True)]))
    assert presence(me) == []  # told twice (a hello's answer): one change
    world.deliver(router.presence_heard("n3", [("b", False)]))
    assert presence(me) == []  # not where it is connected: stale
    world.deliver(router.presence_heard("n2", [("b", False)]))
    assert presence(me) == [("w-1", "offline", "b", False, ["quote"])]
    # Online on n2, then resumed here: it moved, it did not come.
    world.deliver(router.presence_heard("n2", [("b", True)]))
    me.take()
    register = {"sender_id": "b", "message_type": "REGISTER", "auth_token": b.token}
    world.deliver(raw(router, router.open(), **register, payload={}))
    assert presence(me) == []
    assert presence_index.elsewhere == {}
    assert router.online_here() == ["me", "b"]
