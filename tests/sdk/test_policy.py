"""agent_sdk/policy.py and the serving side's checks, against a real lobby: a capability's rate
limit answered `rate_limited` before its handler, an allow-list changed at run time and kept in
step with the lobby, hooks on messages in and out that observe or refuse. The token bucket is
tested synchronously with a given clock."""

from __future__ import annotations

from typing import Any

import pytest

from agent_sdk import (
    Agent,
    Message,
    MessageRefusedError,
    MessageType,
    RateLimit,
    RateLimitedError,
    RequestContext,
    UnauthorizedError,
    capability,
)
from agent_sdk.policy import Policy
from lobby.server import LobbyServer
from tests.sdklogs import sdk_events
from tests.waiting import until


def test_a_token_bucket_allows_a_burst_then_refills_over_time() -> None:
    start = 1000.0
    bucket = RateLimit(calls=2, per=10.0).bucket(start)
    assert bucket.take(start)
    assert bucket.take(start)
    assert not bucket.take(start + 1.0)  # 0.2 of a call back so far
    assert bucket.take(start + 6.0)  # 5 s give one call back
    assert not bucket.take(start + 6.0)
    RateLimit(calls=1, per=0.5)  # the smallest limit
    for calls, per in ((0, 1.0), (1, 0.0), (1, -1.0)):
        with pytest.raises(
            ValueError, match=r"^a rate limit needs calls >= 1 and per > 0 seconds$"
        ):
            RateLimit(calls=calls, per=per)


class Pricer(Agent):
    agent_id = "pricer"

    def __init__(self, url: str) -> None:
        super().__init__(lobby_url=url)
        self.served: list[str] = []

    @capability("quote", authorized=["buyer"], rate_limit=RateLimit(calls=2, per=3600))
    async def quote(self, request: dict[str, Any], ctx: RequestContext) -> dict[str, Any]:
        self.served.append(ctx.requester_id)
        return {"price": 12}

    @capability("ping")
    async def ping(self, request: dict[str, Any], ctx: RequestContext) -> dict[str, Any]:
        self.served.append(f"ping {ctx.requester_id}")
        return {}


async def test_past_its_rate_limit_a_capability_answers_rate_limited_before_the_handler(
    lobby: LobbyServer,
) -> None:
    pricer = Pricer(lobby.url)
    async with pricer, Agent("buyer", lobby_url=lobby.url) as buyer:
        assert await buyer.request("pricer", "quote", {}, timeout=5) == {"price": 12}
        assert await buyer.request("pricer", "quote", {}, timeout=5) == {"price": 12}
        with pytest.raises(RateLimitedError) as limited:
            await buyer.request("pricer", "quote", {}, timeout=5)
        assert "over its rate limit" in limited.value.message
        assert await buyer.request("pricer", "ping", {}, timeout=5) == {}  # its own limit
    assert pricer.served == ["buyer", "buyer", "ping buyer"]


async def test_the_allow_list_changes_at_run_time_at_the_agent_and_at_the_lobby(
    lobby: LobbyServer,
) -> None:
    pricer = Pricer(lobby.url)
    async with pricer, Agent("other", lobby_url=lobby.url) as other:

        async def announced() -> list[str] | None:
            [service] = await other.discover("quote")
            return service.relevant_capabilities[0].authorized_requester_ids

        assert await announced() == ["buyer"]
        with pytest.raises(UnauthorizedError):
            await other.request("pricer", "quote", {}, timeout=5)
        await pricer.set_authorized("quote", ["buyer", "other"])
        assert await announced() == ["buyer", "other"]
        assert await other.request("pricer", "quote", {}, timeout=5) == {"price": 12}
        await pricer.set_authorized("quote", ["buyer"])
        assert await announced() == ["buyer"]
        with pytest.raises(UnauthorizedError):
            await other.request("pricer", "quote", {}, timeout=5)
        with pytest.raises(ValueError, match="no capability 'nothing'"):
            await pricer.set_authorized("nothing", None)
    assert pricer.served == ["other"]


async def test_hooks_observe_and_refuse_messages_in_and_out(lobby: LobbyServer) -> None:
    pricer = Pricer(lobby.url)
    seen_in: list[tuple[str, str]] = []
    sent: list[tuple[str, str]] = []

    @pricer.policy.add_incoming
    def no_rogues(message: Message) -> bool:
        seen_in.append((message.message_type, message.sender_id))
        return message.sender_id != "rogue"

    async with (
        pricer,
        Agent("rogue", lobby_url=lobby.url) as rogue,
        Agent("buyer", lobby_url=lobby.url) as buyer,
    ):
        buyer.policy.add_outgoing(lambda m: sent.append((m.message_type, m.receiver_id)))
        buyer.policy.add_outgoing(lambda m: m.receiver_id != "rogue")
        with pytest.raises(UnauthorizedError) as refused:
            await rogue.request("pricer", "ping", {}, timeout=5)
        assert "refused by the receiver's policy" in refused.value.message
        await rogue.send_text("pricer", "hello")
        assert await buyer.request("pricer", "ping", {}, timeout=5) == {}
        with pytest.raises(MessageRefusedError):
            await buyer.send_text("rogue", "psst")
        with pytest.raises(MessageRefusedError):
            await buyer.request("rogue", "anything", {}, timeout=5)
        await until(lambda: len(seen_in) == 3, "the hook to see three messages")
    assert pricer.served == ["ping buyer"]
    assert sorted(seen_in) == [
        (MessageType.REQUEST, "buyer"),
        (MessageType.REQUEST, "rogue"),
        (MessageType.TEXT, "rogue"),
    ]
    assert sent[:3] == [
        (MessageType.REQUEST, "pricer"),
        (MessageType.TEXT, "rogue"),
        (MessageType.REQUEST, "rogue"),
    ]


def test_a_hook_refuses_with_false_or_by_raising_and_the_failure_is_logged() -> None:
    policy = Policy("me")
    message = Message("me", "other", MessageType.TEXT, {"content": "hi"})
    seen: list[str] = []
    policy.add_outgoing(lambda m: seen.append(m.receiver_id))  # observes: None lets it through
    assert policy.allows(policy.outgoing, message)
    policy.add_outgoing(lambda m: m.receiver_id != "other")
    assert not policy.allows(policy.outgoing, message)

    def broken(m: Message) -> bool:
        raise RuntimeError("boom")

    policy.add_incoming(broken)
    with sdk_events() as logs:
        assert not policy.allows(policy.incoming, message)
    assert [(e["event"], e["agent_id"], e["type"]) for e in logs] == [
        ("POLICY_HOOK_FAILED", "me", MessageType.TEXT)
    ]
    assert "RuntimeError: boom" in logs[0]["line"]  # the hook's own failure, with its traceback
    assert seen == ["other", "other"]
