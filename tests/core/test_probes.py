"""A resume on this node of an agent whose home is another node (`SharedRegistry.gate`,
`Router.probed`, `Router.handed_over`), driven synchronously: it waits for that node's answer
to a probe, then, when the node is alive (and, for `PROBED_FRESH` seconds after, without asking
again), for it to hand the agent over, and goes ahead; when the node is down, it waits for its
failover (`Router.failovers`); it is closed with 1013 when the node does not hand the agent
over."""

from __future__ import annotations

from structlog.testing import capture_logs

from lobby.core import Router, Send
from lobby.core.cluster.shared import PROBED_FRESH
from lobby.core.records import AgentSaved
from lobby.core.refusal import hash_token
from lobby.core.session import REVOKED, Action, Close, Session
from tests.core.test_shared_registry import join_shared
from tests.routerkit import Clock, Peer, frames, make_router, raw

RESUME = {"capabilities": None, "acks": True}


def homed_elsewhere(router: Router, agent_id: str, home: str) -> Peer:
    """An agent registered here, then taken by node `home` (its connection here closed)."""
    peer = join_shared(router, agent_id)
    moved_to(router, peer, home)
    return peer


def moved_to(router: Router, peer: Peer, home: str, token_hash: bytes | None = None) -> None:
    record = router.registry.get(peer.agent_id)
    assert record is not None
    saved = AgentSaved(peer.agent_id, token_hash or record.token_hash, b"[]", True)
    router.learned(saved, home)


def answered(router: Router, home: str) -> list[Action]:
    """`home` answers its probe, alive, and hands over each agent asked for, holding nothing
    of it (what it holds is `tests/core/test_handover.py`'s)."""
    actions = router.probed(home, alive=True)
    shared = router.state.shared
    assert shared is not None
    releases, shared.releases = shared.releases, []
    for asked, agent_id in releases:
        assert asked == home
        actions += router.handed_over(home, agent_id, b"")
    return actions


def resume(router: Router, peer: Peer) -> tuple[Session, list[Action]]:
    session = router.open(peer.agent_id)
    sent = raw(
        router,
        session,
        sender_id=peer.agent_id,
        message_type="REGISTER",
        payload=RESUME,
        auth_token=peer.token,
    )
    return session, sent


def test_a_resume_waits_for_its_homes_probe_and_goes_ahead_when_it_is_alive() -> None:
    router = make_router()
    shared = router.share("here")
    me = homed_elsewhere(router, "me", "n2")
    session, sent = resume(router, me)
    assert sent == []  # nothing yet: waiting for n2's answer
    assert shared.probes == ["n2"]
    assert router.probed("n2", alive=True) == []  # alive: now n2 is asked to hand it over
    assert shared.releases == [("n2", "me")]
    (ack,) = frames(router.handed_over("n2", "me", b""))
    assert ack["message_type"] == "REGISTER_ACK"
    assert ack["payload"]["status"] == "success_resumed"
    record = router.registry.get("me")
    assert record is not None
    assert record.session is session
    assert record.home is None  # home here now


def test_a_home_that_answered_is_not_asked_again_for_probed_fresh_seconds() -> None:
    clock = Clock()
    router = make_router(clock)
    shared = router.share("here")
    me = homed_elsewhere(router, "me", "n2")
    resume(router, me)
    answered(router, "n2")
    asked = len(shared.probes)
    for after, probes in ((PROBED_FRESH, asked), (PROBED_FRESH + 0.001, asked + 1)):
        clock.now += after
        moved_to(router, me, "n2")  # taken by n2 again
        session, sent = resume(router, me)
        assert sent == []
        assert len(shared.probes) == probes, after
        if probes == asked:  # within the window: n2 is asked for the agent at once
            assert shared.releases == [("n2", "me")]
            shared.releases.clear()
            sent = router.handed_over("n2", "me", b"")
            assert frames(sent)[-1]["payload"]["status"] == "success_resumed"
            assert router.registry.get("me").session is session  # type: ignore[union-attr]
        else:
            answered(router, "n2")
        clock.now -= after


def test_an_answer_from_the_future_is_not_taken_as_fresh() -> None:
    """A clock set back after the answer: the node is asked again rather than trusted."""
    clock = Clock()
    router = make_router(clock)
    shared = router.share("here")
    me = homed_elsewhere(router, "me", "n2")
    resume(router, me)
    answered(router, "n2")
    clock.now -= 1.0
    moved_to(router, me, "n2")
    _, sent = resume(router, me)
    assert sent == []
    assert shared.probes == ["n2", "n2"]


def test_a_waiting_resume_refused_when_it_goes_ahead_gets_its_error() -> None:
    router = make_router()
    router.share("here")
    you = homed_elsewhere(router, "you", "n4")
    session, _ = resume(router, you)
    moved_to(router, you, "n4", hash_token("another token"))  # replaced on n4 meanwhile
    (error,) = frames(answered(router, "n4"))
    assert error["message_type"] == "ERROR"
    assert error["payload"]["code"] == "agent_id_taken"
    assert error["payload"]["original_message_type"] == "REGISTER"
    assert session.agent is None


def test_resumes_waiting_for_a_dead_home_wait_on_for_its_failover_and_it_is_logged() -> None:
    router = make_router()
    shared = router.share("here")
    me = homed_elsewhere(router, "me", "gone")
    first, _ = resume(router, me)
    second, _ = resume(router, me)
    with capture_logs() as logs:
        assert router.probed("gone", alive=False) == []
    assert logs == [
        {
            "event": "CLUSTER_NODE_DOWN",
            "log_level": "warning",
            "node_id": "gone",
            "resumes_held": 2,
        }
    ]
    # Known down: the next resume waits as well, without another probe.
    third, sent = resume(router, me)
    assert sent == []
    assert list(shared.failing_over) == [first, second, third]
    assert shared.probes == ["gone"]


def test_every_resume_waiting_for_a_home_goes_ahead_in_order_when_it_answers() -> None:
    router = make_router()
    router.share("here")
    me = homed_elsewhere(router, "me", "n2")
    you = homed_elsewhere(router, "you", "n2")
    first, _ = resume(router, me)
    refused, _ = resume(router, you)
    second, _ = resume(router, me)
    moved_to(router, you, "n2", hash_token("another token"))  # replaced on n2 meanwhile
    actions = answered(router, "n2")
    sent = [a for a in actions if isinstance(a, Send)]
    # Each agent's resumes in the order they came (each agent is handed over on its own).
    assert [a.session for a in sent] == [first, second, refused]
    assert [f["message_type"] for f in frames(sent)] == [
        "REGISTER_ACK",
        "REGISTER_ACK",
        "ERROR",
    ]
    assert Close(first, 4001, "replaced by a newer connection") in actions
    assert router.registry.get("me").session is second  # type: ignore[union-attr]


def test_an_answer_nobody_waits_for_changes_nothing_but_what_it_says() -> None:
    """A late or repeated answer: no resume to run or close; a dead node is still noted."""
    router = make_router()
    shared = router.share("here")
    assert router.probed("n2", alive=True) == []
    assert router.probed("gone", alive=False) == []
    assert "gone" in shared.held


def test_a_revoked_agent_homed_elsewhere_is_taken_over_after_the_probe_never_resumed() -> None:
    """A REGISTER without a token takes a revoked id over (a new token): it waits for the home
    like a resume. One with a token is refused at once, without asking the home."""
    router = make_router()
    shared = router.share("here")
    me = homed_elsewhere(router, "me", "n2")
    router.learned(AgentSaved("me", REVOKED, b"[]", True), "n2")
    with_token, refused = resume(router, me)
    (error,) = frames(refused)
    assert error["message_type"] == "ERROR"
    assert shared.probes == []
    session = router.open("me")
    sent = raw(router, session, sender_id="me", message_type="REGISTER", payload=RESUME)
    assert sent == []  # waiting for n2's answer
    assert shared.probes == ["n2"]
    (ack,) = frames(answered(router, "n2"))
    assert ack["message_type"] == "REGISTER_ACK"
    assert ack["payload"]["status"] == "success_registered_finalized"
    assert with_token.agent is None


def test_resumes_whose_home_does_not_hand_the_agent_over_are_closed_with_1013() -> None:
    router = make_router()
    shared = router.share("here")
    me = homed_elsewhere(router, "me", "n2")
    first, _ = resume(router, me)
    second, _ = resume(router, me)
    router.probed("n2", alive=True)
    assert shared.releases == [("n2", "me")]  # one request for both
    reason = "its home node n2 did not hand it over in time: try again"
    assert router.handed_over("n2", "me", None) == [
        Close(first, 1013, reason),
        Close(second, 1013, reason),
    ]
    assert router.registry.get("me").home == "n2"  # type: ignore[union-attr]
    assert "n2" not in shared.held  # up, only slow: the next resume asks again
