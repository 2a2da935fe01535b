"""Who may be judged dead, and when (`lobby.cluster.verdicts`): pure, times given."""

from __future__ import annotations

from lobby.cluster.verdicts import Verdicts


def judge(*others: str, at: float = 0.0) -> Verdicts:
    verdicts = Verdicts("me", ttl=3.0, dead_after=10.0)
    for node in ("me", *others):
        verdicts.heard_from(node, at)
    return verdicts


def test_nobody_is_judged_before_this_node_beat_once() -> None:
    verdicts = judge("a")
    assert verdicts.suspects(100.0) == []
    assert verdicts.restored(100.0)
    assert verdicts.suspects(105.0) == []  # a whole window from its own first beat
    assert verdicts.suspects(110.5) == ["a"]


def test_a_node_silent_past_dead_after_is_a_suspect_and_out_of_view_past_ttl() -> None:
    verdicts = judge("a", "b")
    verdicts.restored(0.0)
    verdicts.heard_from("b", 8.0)
    assert verdicts.alive(5.0) == ["b"]  # a and me last heard at 0 (me beats elsewhere)
    assert verdicts.suspects(9.0) == []
    assert verdicts.suspects(10.5) == ["a"]  # never itself
    verdicts.gone("a")  # stopped cleanly: judged no more
    assert verdicts.suspects(30.0) == ["b"]


def test_losing_nats_suspends_judgement_and_its_return_gives_everyone_a_whole_window() -> None:
    verdicts = judge("a")
    verdicts.restored(0.0)
    assert verdicts.cut_off()
    assert not verdicts.cut_off()  # once
    assert verdicts.suspects(50.0) == []  # cut off: judges nobody
    assert verdicts.restored(50.0)
    assert not verdicts.restored(51.0)
    # a was last heard at 0, 50 s ago, but this node has been sound for less than 10 s.
    assert verdicts.suspects(59.0) == []
    assert verdicts.suspects(60.5) == ["a"]


def test_a_node_heard_after_this_one_recovered_counts_from_its_heartbeat() -> None:
    verdicts = judge("a")
    verdicts.restored(0.0)
    verdicts.cut_off()
    verdicts.restored(20.0)
    verdicts.heard_from("a", 25.0)
    assert verdicts.suspects(34.0) == []
    assert verdicts.suspects(35.5) == ["a"]
