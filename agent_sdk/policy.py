"""Policy in one place: rate limits of capabilities, and hooks on every message in and out.

    class Pricer(Agent):
        @capability("quote", authorized=["buyer"], rate_limit=RateLimit(calls=10, per=1.0))
        async def quote(self, request: Item, ctx: RequestContext) -> Quote: ...

    pricer = Pricer()
    pricer.policy.add_outgoing(lambda message: message.receiver_id != "rival")  # refuse
    pricer.policy.add_incoming(audit)                                       # observe
    await pricer.set_authorized("quote", ["buyer", "auditor"])              # at run time

A capability's `rate_limit` is a token bucket per agent object: past it, a REQUEST is answered
with status `error`, code `rate_limited`, before its input is read or its handler runs. Who may
call a capability (`authorized`) is announced to the lobby, which refuses anyone else; the
agent checks it too, so a change made with `set_authorized()` holds from the moment it is
made, before the lobby has it.

A hook is a plain function of the `Message`, called in the read loop or on the way out (keep
it quick; no await). It returns False to refuse the message, anything else to let it through:
- outgoing hooks see every message this agent sends (to agents and to the lobby); a refused
  one is not sent and the send raises `MessageRefusedError` (a handler's RESPONSE refused so
  is logged, not sent);
- incoming hooks see every message delivered to the agent's callbacks and handlers (REQUESTs,
  moves, TEXTs, notices; not the answers to its own calls, which go to the waiting call); a
  refused one is dropped and acknowledged, and a refused REQUEST is answered with code
  `unauthorized`.
A hook that raises refuses the message, and the failure is logged (`POLICY_HOOK_FAILED`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from agent_sdk.logs import log
from protocol.limits import TokenBucket
from protocol.models import Message

Hook = Callable[[Message], bool | None]
"""Returns False to refuse the message; anything else lets it through."""


@dataclass(frozen=True, slots=True)
class RateLimit:
    """At most `calls` REQUESTs every `per` seconds, in bursts of up to `calls`."""

    calls: int
    per: float = 1.0

    def __post_init__(self) -> None:
        if self.calls < 1 or self.per <= 0:
            raise ValueError("a rate limit needs calls >= 1 and per > 0 seconds")

    def bucket(self, now: float) -> TokenBucket:
        """A full bucket for this limit, its clock starting at `now` (monotonic seconds)."""
        return TokenBucket(self.calls / self.per, self.calls, now)


class Policy:
    """The hooks of one agent, in the order added: `agent.policy`."""

    def __init__(self, agent_id: str) -> None:
        self.agent_id = agent_id
        self.outgoing: list[Hook] = []
        self.incoming: list[Hook] = []

    def add_outgoing(self, hook: Hook) -> Hook:
        """Call `hook` on every message before it is sent; usable as a decorator."""
        self.outgoing.append(hook)
        return hook

    def add_incoming(self, hook: Hook) -> Hook:
        """Call `hook` on every message before it is delivered; usable as a decorator."""
        self.incoming.append(hook)
        return hook

    def allows(self, hooks: list[Hook], message: Message) -> bool:
        """True unless one of `hooks` refuses `message` (returns False, or raises)."""
        for hook in hooks:
            try:
                if hook(message) is False:
                    return False
            except Exception:
                log.exception(
                    "POLICY_HOOK_FAILED", agent_id=self.agent_id, type=message.message_type
                )
                return False
        return True
