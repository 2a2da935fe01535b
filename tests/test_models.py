"""protocol.models: what the wire's names and codes mean."""

from __future__ import annotations

import pytest

from protocol.models import CloseCode, close_code_name


@pytest.mark.parametrize(
    ("code", "name"),
    [
        (None, "none"),
        (1000, "normal"),
        (CloseCode.GOING_AWAY, "going_away"),
        (CloseCode.UNREGISTERED, "unregistered"),
        (4999, "unknown"),
    ],
)
def test_a_close_code_is_named_for_the_logs(code: int | None, name: str) -> None:
    assert close_code_name(code) == name
