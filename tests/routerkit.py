"""A small harness to drive the sans-I/O Router synchronously, agent by agent."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson

from lobby.core import Router, Send, Session
from lobby.core.limits import Limits


class Clock:
    def __init__(self, now: float = 1_700_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@dataclass
class Peer:
    """One registered agent: send frames, and read what the router sent to it."""

    router: Router
    agent_id: str
    session: Session
    token: str
    inbox: list[dict[str, Any]] = field(default_factory=list)

    def send(self, message_type: str, payload: dict[str, Any], **envelope: Any) -> None:
        frame = {
            "sender_id": self.agent_id,
            "receiver_id": envelope.pop("receiver_id", "global_lobby"),
            "message_type": message_type,
            "payload": payload,
            "auth_token": self.token,
            **envelope,
        }
        world.deliver(self.router.handle(self.session, orjson.dumps(frame).decode()))
        while self.router.queries:  # as the server does, one per pass of its loop
            world.deliver(self.router.answer_query())

    def to(
        self, receiver: str, message_type: str, payload: dict[str, Any], **envelope: Any
    ) -> None:
        self.send(message_type, payload, receiver_id=receiver, **envelope)

    def take(self) -> list[dict[str, Any]]:
        received, self.inbox[:] = list(self.inbox), []
        return received

    def last(self) -> dict[str, Any]:
        assert self.inbox, f"{self.agent_id} received nothing"
        return self.inbox.pop()


class World:
    def __init__(self) -> None:
        self.peers: dict[int, Peer] = {}

    def deliver(self, actions: list[Any]) -> None:
        for action in actions:
            if isinstance(action, Send):
                peer = self.peers.get(action.session.id)
                if peer is not None:
                    peer.inbox.append(orjson.loads(action.frame))


world = World()


def make_router(clock: Clock | None = None, **kwargs: Any) -> Router:
    return Router(
        limits=Limits(message_rate=0, registration_rate=0, discover_rate=0),
        clock=clock or Clock(),
        **kwargs,
    )


def join(router: Router, agent_id: str, **payload: Any) -> Peer:
    session = router.open(agent_id)
    frame = {
        "sender_id": agent_id,
        "receiver_id": "global_lobby",
        "message_type": "REGISTER",
        "payload": payload,
    }
    ack, *told = router.handle(session, orjson.dumps(frame).decode())  # told: PRESENCE
    assert isinstance(ack, Send)
    token = orjson.loads(ack.frame)["payload"]["auth_token"]
    peer = Peer(router, agent_id, session, token)
    world.peers[session.id] = peer
    world.deliver(told)
    return peer


# Shared by the core's tests: a capability, raw frames, and a requester/server pair.


def cap(name: str, authorized: list[str] | None = None, **extra: Any) -> dict[str, Any]:
    return {
        "name": name,
        "description": f"does {name}",
        "input_schema": {},
        "output_schema": {},
        "authorized_requester_ids": authorized,
        **extra,
    }


def raw(router: Router, session: Any, **frame: Any) -> list[Any]:
    frame.setdefault("receiver_id", "global_lobby")
    frame.setdefault("payload", {})
    return router.handle(session, orjson.dumps(frame).decode())


def frames(actions: list[Any]) -> list[dict[str, Any]]:
    return [orjson.loads(a.frame) for a in actions if isinstance(a, Send)]


def pair(authorized: list[str] | None = None) -> tuple[Router, Peer, Peer]:
    router = make_router()
    return router, join(router, "alice"), join(router, "bob", capabilities=[cap("c", authorized)])


def request(peer: Peer, to: str = "bob", conversation: str | None = "k", **payload: Any) -> None:
    envelope = {"conversation_id": conversation} if conversation else {}
    peer.to(to, "REQUEST", {"capability_name": "c", **payload}, **envelope)
