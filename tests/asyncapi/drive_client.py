"""Drive the Python client that @asyncapi/generator made from protocol/asyncapi-agent.json
(generate-client.mjs) against a lobby, through its generated API alone: `send_*` methods for
what an agent sends, `register_receive_*_handler` for what it gets.

    python tests/asyncapi/drive_client.py CLIENT_DIR LOBBY_URL AGENT_ID CAPABILITY OUT_FILE

It registers AGENT_ID (with acks), discovers CAPABILITY, calls its first provider with
`{"n": 21}`, acknowledges the answers with ACK, then pulls its mailbox (FETCH_MESSAGES) to see
that nothing is left unacknowledged. OUT_FILE gets what came back, as JSON. The generated client
prints its own log lines to stdout; this script writes nothing else there.
"""

from __future__ import annotations

import importlib
import json
import queue
import sys
import threading
import time
import uuid
from typing import Any

LOBBY = "global_lobby"
TIMEOUT = 10.0

# The receive operations this run expects, by the `message_type` that routes a frame to each:
# the generated client dispatches on a (key, value) pair given with each handler.
RECEIVED = {
    "receive_register_ack": "REGISTER_ACK",
    "receive_services_available": "SERVICES_AVAILABLE",
    "receive_accepted": "ACCEPTED",
    "receive_response_delivered": "RESPONSE",
    "receive_messages": "MESSAGES",
    "receive_error": "ERROR",
}


class Run:
    def __init__(self, client_dir: str, url: str, agent_id: str) -> None:
        sys.path.insert(0, client_dir)
        generated: Any = importlib.import_module("client").LobbyAgent
        opened = threading.Event()

        class Client(generated):  # type: ignore[misc]
            """The generated class, told when its connection opens (its `on_open` hook)."""

            def on_open(self, ws: Any) -> None:
                super().on_open(ws)
                opened.set()

        self.agent_id = agent_id
        self.token: str | None = None
        self.frames: queue.Queue[dict[str, Any]] = queue.Queue()
        self.held: list[dict[str, Any]] = []
        self.unrouted: list[str] = []
        self.client: Any = Client(url)
        for operation, message_type in RECEIVED.items():
            register = getattr(self.client, f"register_{operation}_handler")
            register(self._received, "message_type", message_type)
        # Frames no receive handler claimed come here.
        self.client.register_message_handler(self.unrouted.append)
        self.client.connect()
        if not opened.wait(TIMEOUT):
            raise RuntimeError(f"no connection to {url}")

    def _received(self, raw: str) -> None:
        self.frames.put(json.loads(raw))

    def send(
        self, operation: str, receiver_id: str, message_type: str, **fields: Any
    ) -> dict[str, Any]:
        """Send one frame with the generated `send_<operation>`, and return it."""
        conversation_id = fields.pop("conversation_id", str(uuid.uuid4()))
        frame = {
            "sender_id": self.agent_id,
            "receiver_id": receiver_id,
            "message_type": message_type,
            "message_id": str(uuid.uuid4()),
            "conversation_id": conversation_id,
            **fields,
        }
        if self.token is not None:
            frame["auth_token"] = self.token
        getattr(self.client, f"send_{operation}")(frame)
        return frame

    def next(self, message_type: str, answering: dict[str, Any] | None = None) -> dict[str, Any]:
        """The next frame of `message_type` (in the conversation of the frame it is `answering`);
        frames of other kinds wait for their turn. An ERROR stops the run."""

        def wanted(frame: dict[str, Any]) -> bool:
            if frame["message_type"] == "ERROR":
                raise RuntimeError(f"the lobby answered ERROR: {frame}")
            return frame["message_type"] == message_type and (
                answering is None or frame.get("conversation_id") == answering["conversation_id"]
            )

        for index, frame in enumerate(self.held):
            if wanted(frame):
                return self.held.pop(index)
        deadline = time.monotonic() + TIMEOUT
        while True:
            try:
                frame = self.frames.get(timeout=max(deadline - time.monotonic(), 0.001))
            except queue.Empty:
                raise RuntimeError(f"no {message_type}; holding {self.held}") from None
            if wanted(frame):
                return frame
            self.held.append(frame)


def main(client_dir: str, url: str, agent_id: str, capability: str, out_file: str) -> None:
    run = Run(client_dir, url, agent_id)
    run.send("register", LOBBY, "REGISTER", payload={"acks": True})
    registered = run.next("REGISTER_ACK")
    run.token = registered["payload"]["auth_token"]

    search = run.send(
        "discover_services", LOBBY, "DISCOVER_SERVICES", payload={"capability_name": capability}
    )
    found = run.next("SERVICES_AVAILABLE", search)["payload"]["services_found"]
    provider = found[0]["agent_id"]

    call = run.send(
        "request", provider, "REQUEST", payload={"capability_name": capability, "n": 21}
    )
    # ACCEPTED (the lobby stored the REQUEST) names the message_id it covers.
    accepted = run.next("ACCEPTED")
    responses = [run.next("RESPONSE", call)]
    while responses[-1]["payload"]["status"] == "in_progress":
        responses.append(run.next("RESPONSE", call))

    run.send("ack", LOBBY, "ACK", payload={"up_to": responses[-1]["seq"]})
    pull = run.send("fetch_messages", LOBBY, "FETCH_MESSAGES", payload={})
    mailbox = run.next("MESSAGES", pull)["payload"]
    run.client.close()

    result = {
        "registered": registered["payload"]["status"],
        "found": found,
        "request_id": call["message_id"],
        "accepted": accepted["payload"],
        "responses": [{"seq": r["seq"], "payload": r["payload"]} for r in responses],
        "unacknowledged": mailbox["messages"],
        "unrouted": run.unrouted,
    }
    with open(out_file, "w", encoding="utf-8") as out:
        json.dump(result, out)


if __name__ == "__main__":
    if len(sys.argv) != 6:
        sys.exit(__doc__)
    main(*sys.argv[1:])
