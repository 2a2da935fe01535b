"""protocol.limits: `clip`, the one way a string from the wire is quoted."""

from __future__ import annotations

from protocol.limits import CLIP_LENGTH, clip


def test_a_string_up_to_the_limit_is_kept_whole() -> None:
    assert clip("abc", 3) == "abc"
    assert clip("x" * CLIP_LENGTH) == "x" * CLIP_LENGTH


def test_a_longer_string_is_cut_and_says_how_much_was_cut() -> None:
    assert clip("abcdef", 3) == "abc...(+3 characters)"
    assert clip("y" * (CLIP_LENGTH + 2)) == "y" * CLIP_LENGTH + "...(+2 characters)"
