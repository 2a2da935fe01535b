"""agent_sdk/identity.py's pure parts: the token stores' behaviour and what a refused REGISTER
is explained as (tests/test_sdk_identity.py runs them against real lobbies)."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent_sdk import (
    AgentIdTakenError,
    EnvTokenStore,
    FileTokenStore,
    MemoryTokenStore,
    RegistrationError,
    TokenRefusedError,
)
from agent_sdk.identity import Identity, announced_identity, lobby_key
from tests.sdklogs import sdk_events

LOBBY = "ws://127.0.0.1:8765/"
TOKEN = "3f1c2a9e-0000-4000-8000-000000000001"


def test_the_memory_store_keeps_tokens_per_lobby_and_agent() -> None:
    store = MemoryTokenStore()
    assert store.load(LOBBY, "a") is None
    store.save(LOBBY, "a", TOKEN)
    assert store.load("ws://127.0.0.1:8765/other-path", "a") == TOKEN  # same host and port
    assert store.load("ws://127.0.0.1:9999/", "a") is None
    assert store.load(LOBBY, "b") is None
    store.delete(LOBBY, "a")
    assert store.load(LOBBY, "a") is None
    assert TOKEN not in store.where(LOBBY, "a")


def test_the_file_store_round_trips_and_deletes(tmp_path: Path) -> None:
    store = FileTokenStore(tmp_path)
    assert store.load(LOBBY, "a") is None
    store.save(LOBBY, "a", TOKEN)
    assert store.load(LOBBY, "a") == TOKEN
    assert store.where(LOBBY, "a") == f"file {store.path(LOBBY, 'a')}"
    store.delete(LOBBY, "a")
    store.delete(LOBBY, "a")  # deleting twice is fine
    assert store.load(LOBBY, "a") is None


def test_the_env_store_reads_the_variable_and_keeps_a_new_token_in_memory_only(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("AGENT_TOKEN", TOKEN)
    store = EnvTokenStore("AGENT_TOKEN")
    assert store.load(LOBBY, "a") == TOKEN
    with sdk_events() as logs:
        store.save(LOBBY, "a", TOKEN)  # the one it holds: nothing to say
        assert logs == []
        store.save(LOBBY, "a", "reissued")
    assert [e["event"] for e in logs] == ["TOKEN_NOT_SAVED"]
    assert "reissued" not in repr(logs)
    assert store.load(LOBBY, "a") == "reissued"
    store.delete(LOBBY, "a")
    assert store.load(LOBBY, "a") == TOKEN
    assert store.where(LOBBY, "a") == "environment variable AGENT_TOKEN"


def test_a_refusal_other_than_a_taken_id_is_raised_as_is() -> None:
    identity = Identity("a", LOBBY, None, MemoryTokenStore())
    refused = RegistrationError("auth_failed", "bad token")
    assert identity.refusal(refused, TOKEN) is refused


def test_a_taken_id_is_explained_with_or_without_a_token() -> None:
    identity = Identity("a", LOBBY, None, None)
    taken = RegistrationError("agent_id_taken", "taken")
    without = identity.refusal(taken, None)
    assert type(without) is AgentIdTakenError
    assert without.source is None
    assert "no token store" in str(without)
    assert "`lobby remove a`" in str(without)
    identity.source = "the token= argument"
    with_token = identity.refusal(taken, TOKEN)
    assert isinstance(with_token, TokenRefusedError)
    assert with_token.source == "the token= argument"
    assert TOKEN not in str(with_token)


ONE = "0123456789abcdef0123456789abcdef"
OTHER = "fedcba9876543210fedcba9876543210"


def test_a_lobby_is_keyed_by_its_identity_else_its_host_and_port() -> None:
    assert lobby_key(ONE) == ONE
    assert lobby_key(LOBBY) == "127.0.0.1_8765"
    assert announced_identity(ONE) == ONE
    for unusable in (None, "", "127.0.0.1_8765", "../../etc", "x" * 65, "ABC"):
        assert announced_identity(unusable) is None


async def test_a_token_is_offered_to_its_own_lobby_only() -> None:
    store = MemoryTokenStore()
    store.save(ONE, "a", TOKEN)
    identity = Identity("a", LOBBY, None, store)
    assert await identity.token_for(ONE) == TOKEN
    assert await identity.token_for(OTHER) is None  # another lobby on the same address
    await identity.keep("issued-by-other", resumed=False)
    assert store.load(OTHER, "a") == "issued-by-other"
    assert await identity.token_for(ONE) == TOKEN
    assert await identity.token_for(None) is None  # a lobby announcing none: host_port
    explicit = Identity("a", LOBBY, "given", None)
    assert await explicit.token_for(ONE) == "given"
    assert await explicit.token_for(ONE) == "given"  # a reconnect to the same lobby
    assert await explicit.token_for(OTHER) is None  # it was for the first lobby reached
    assert await explicit.token_for(ONE) is None


async def test_a_revoked_token_is_explained_as_one_to_delete() -> None:
    store = MemoryTokenStore()
    store.save(ONE, "a", TOKEN)
    identity = Identity("a", LOBBY, None, store)
    presented = await identity.token_for(ONE)
    revoked = RegistrationError("agent_id_taken", "the auth_token of agent 'a' was revoked")
    refusal = identity.refusal(revoked, presented)
    assert isinstance(refusal, TokenRefusedError)
    assert "an operator revoked it; delete it (this process's memory)" in str(refusal)
    assert TOKEN not in str(refusal)
