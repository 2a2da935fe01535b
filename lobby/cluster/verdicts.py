"""Who may be judged dead, and when: the pure part of `lobby.cluster.liveness` (no I/O, times
passed in, so it is tested like a function).

A lapsed heartbeat says as much about the judge as about the judged: when NATS restarts, or
the judge's own link to it stalls, every other node's heartbeat lapses in the judge's view at
once, while those nodes are fine. So a node judges others only from a sound footing:
- it counts as *sound* while its own connection to NATS is up and its own heartbeats succeed;
  on losing either (`cut_off`) it judges nobody, and on regaining them (`restored`) it starts
  a new window: every other node gets a whole `dead_after` from that moment, whatever it last
  heard of it;
- a node is a *suspect* once its last heartbeat (or the start of that window, if later) is
  older than `dead_after`, which outlasts a NATS blip (10 s by default: a 3 s restart of the
  only server, a 5 s stall of one server of three). Suspects are only that: `recovery` fails
  one over on evidence besides (no answer on `lobby.ping.<node>`, and NATS no longer holds its
  key in `nodes`).
The cost: a node that really died keeps its agents waiting `dead_after` (plus one check, about
a second, and the failover itself) before a survivor adopts them, longer after a NATS outage,
since the window restarts when the survivor reconnects.
"""

from __future__ import annotations


class Verdicts:
    """The heartbeats node `node_id` heard, and its judgement of them."""

    def __init__(self, node_id: str, *, ttl: float, dead_after: float) -> None:
        self.node_id = node_id
        self.ttl = ttl
        """Seconds a node counts as alive (in `/healthz`'s view) after its last heartbeat."""
        self.dead_after = dead_after
        """Seconds after its last heartbeat from which a node is a suspect."""
        self.heard: dict[str, float] = {}
        """Node id -> when its last heartbeat was seen."""
        self.sound_since: float | None = None
        """When this node's own link and heartbeats last became sound; None while they are
        not (at start, and from `cut_off` to `restored`)."""

    def heard_from(self, node_id: str, now: float) -> None:
        self.heard[node_id] = now

    def gone(self, node_id: str) -> None:
        """Its key was deleted: it stopped cleanly, and is judged no more."""
        self.heard.pop(node_id, None)

    def cut_off(self) -> bool:
        """This node lost NATS, or a heartbeat of its own failed or came late: True if it was
        sound until now."""
        was = self.sound_since is not None
        self.sound_since = None
        return was

    def restored(self, now: float) -> bool:
        """This node's own heartbeat succeeded: True if that starts a new window."""
        if self.sound_since is not None:
            return False
        self.sound_since = now
        return True

    def alive(self, now: float) -> list[str]:
        """The nodes heard from within `ttl`, sorted."""
        return sorted(n for n, at in self.heard.items() if now - at <= self.ttl)

    def suspects(self, now: float) -> list[str]:
        """Other nodes silent for `dead_after` while this node was sound, sorted."""
        since = self.sound_since
        if since is None:
            return []
        return sorted(
            n
            for n, at in self.heard.items()
            if n != self.node_id and now - max(at, since) > self.dead_after
        )
