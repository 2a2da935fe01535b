"""protocol.limits: `clip`, the one way a string from the wire is quoted, and `TokenBucket`."""

from __future__ import annotations

from protocol.limits import CLIP_LENGTH, TokenBucket, clip


def test_a_string_up_to_the_limit_is_kept_whole() -> None:
    assert clip("abc", 3) == "abc"
    assert clip("x" * CLIP_LENGTH) == "x" * CLIP_LENGTH


def test_a_longer_string_is_cut_and_says_how_much_was_cut() -> None:
    assert clip("abcdef", 3) == "abc...(+3 characters)"
    assert clip("y" * (CLIP_LENGTH + 2)) == "y" * CLIP_LENGTH + "...(+2 characters)"


def test_a_bucket_is_full_again_exactly_when_its_burst_has_refilled() -> None:
    bucket = TokenBucket(rate=2.0, burst=4.0, now=100.0)
    assert bucket.is_full(100.0)
    assert bucket.take(100.0)
    assert bucket.take(100.0)  # 2 of 4 left
    assert not bucket.is_full(100.9)  # 3.8
    assert bucket.is_full(101.0)  # 4.0: full, and what forgets an idle address's counter
    assert bucket.is_full(150.0)


def test_a_refused_bucket_waits_only_for_what_its_next_token_still_lacks() -> None:
    bucket = TokenBucket(rate=2.0, burst=1.0, now=100.0)
    assert bucket.take(100.0)
    assert bucket.wait() == 0.5  # empty: a whole token at 2 a second
    assert not bucket.take(100.25)  # half a token refilled
    assert bucket.wait() == 0.25
