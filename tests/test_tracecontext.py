"""protocol.tracecontext: W3C traceparents started and moved on by one hop (the checks on
received ones are tests/test_codec.py's)."""

from __future__ import annotations

import pytest

from protocol import tracecontext

TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def test_a_started_trace_is_valid_sampled_and_new_each_time() -> None:
    first, second = tracecontext.start(), tracecontext.start()
    assert tracecontext.problem(first) is None
    assert first.endswith("-01")
    assert tracecontext.trace_id(first) != tracecontext.trace_id(second)


def test_a_hop_keeps_trace_and_flags_with_a_new_parent_id() -> None:
    moved = tracecontext.hop(TRACEPARENT)
    assert tracecontext.problem(moved) is None
    assert tracecontext.trace_id(moved) == tracecontext.trace_id(TRACEPARENT)
    assert tracecontext.parent_id(moved) != tracecontext.parent_id(TRACEPARENT)
    assert moved.endswith("-01")
    assert tracecontext.hop(TRACEPARENT, "1234567890abcdef") == (
        "00-4bf92f3577b34da6a3ce929d0e0e4736-1234567890abcdef-01"
    )


def test_a_later_version_is_passed_on_as_version_00() -> None:
    later = "cc" + TRACEPARENT[2:] + "-more"
    assert tracecontext.hop(later, "1234567890abcdef") == (
        "00-4bf92f3577b34da6a3ce929d0e0e4736-1234567890abcdef-01"
    )


def test_an_all_zero_id_drawn_is_drawn_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """W3C forbids all-zero trace and parent ids; the random source may still draw one."""
    draws = iter([bytes(16), bytes.fromhex("4bf92f3577b34da6a3ce929d0e0e4736")])
    monkeypatch.setattr(tracecontext, "_random_bytes", lambda n: next(draws))
    assert tracecontext.new_trace_id() == "4bf92f3577b34da6a3ce929d0e0e4736"
    draws = iter([bytes(8), bytes.fromhex("00f067aa0ba902b7")])
    assert tracecontext.new_span_id() == "00f067aa0ba902b7"


@pytest.mark.parametrize(
    ("traceparent", "problem"),
    [
        (
            "abc",
            "is not a W3C traceparent (00-<32 hex trace-id>-<16 hex parent-id>-<2 hex flags>)",
        ),
        ("ff" + TRACEPARENT[2:], "has version ff, which W3C forbids"),
        (TRACEPARENT + "-x", "has version 00 and must be exactly 55 characters"),
        (f"00-{'0' * 32}-00f067aa0ba902b7-01", "has an all-zero trace-id"),
        (f"00-4bf92f3577b34da6a3ce929d0e0e4736-{'0' * 16}-01", "has an all-zero parent-id"),
        (TRACEPARENT, None),
    ],
)
def test_each_traceparent_problem_is_named_in_its_own_words(
    traceparent: str, problem: str | None
) -> None:
    assert tracecontext.problem(traceparent) == problem
