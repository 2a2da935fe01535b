"""The links of the sessions a node routes other nodes' messages through (`lobby.cluster.routing`):
a relay session's answers go back to the sender's node; a resend's, whose sender is not
connected here, go nowhere."""

from __future__ import annotations


class SilentLink:
    """The link of a session that routes a resend whose sender is not connected here: what it
    is answered has nobody to go to (the sender resends it after reconnecting anyway)."""

    remote = "resend"

    def put(self, frame: bytes) -> bool:
        return False

    def flush(self) -> int:
        return 0

    def shut(self, code: int, reason: str) -> None:
        return None

    def pause(self, seconds: float) -> None:
        return None


class NodeLink:
    """The link of a relay session: frames written to it go back to the node the sender is
    on, gathered until the server's flush at the end of the pass."""

    def __init__(self, returns: dict[str, list[bytes]], node_id: str, agent_id: str) -> None:
        self.node_id = node_id
        self.remote = f"node {node_id}"
        self._agent = agent_id.encode()
        self._returns = returns
        """The relay's answers to publish, per node (`Relay.returns`)."""

    def put(self, frame: bytes) -> bool:
        lines = self._returns.get(self.node_id)
        if lines is None:
            lines = self._returns[self.node_id] = []
        lines.append(self._agent)
        lines.append(frame)
        return True

    def flush(self) -> int:
        return 0  # the relay publishes what was put, per node, in its `kick`

    def shut(self, code: int, reason: str) -> None:
        return None

    def pause(self, seconds: float) -> None:
        return None  # rate limits are the sender's node's: it paused the sender's connection
