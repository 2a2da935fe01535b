"""The shared registry's wire form: KV bucket `agents`, one key per agent id.

KV keys allow only `[-/_=.a-zA-Z0-9]` and a `.` separates subject tokens, while agent ids may
hold `.`, `:` and `@`: a key keeps letters, digits and `-`, and writes every other character
as `_` and its two hex digits (`seller.7` -> `seller_2e7`), so it is readable and reversible.
The value is JSON: the token's SHA-256 (never the token), the capabilities as declared, acks,
and the node that wrote it, which is the agent's home: a node writes the agent's key whenever
the agent registers or resumes there, so its revision also counts the agent's connections.
"""

from __future__ import annotations

import re
from typing import Final

import orjson

from lobby.core.records import AgentSaved

AGENTS: Final = "agents"
"""The KV bucket of registrations."""

_KEEP = re.compile(r"[A-Za-z0-9-]")
_ESCAPED = re.compile(r"_([0-9a-f]{2})")


def agent_key(agent_id: str) -> str:
    """The KV key of `agent_id` (agent ids are ASCII: `protocol.models.AGENT_ID_RE`)."""
    return "".join(c if _KEEP.fullmatch(c) else f"_{ord(c):02x}" for c in agent_id)


def agent_id_of(key: str) -> str:
    return _ESCAPED.sub(lambda m: chr(int(m.group(1), 16)), key)


def encode_agent(saved: AgentSaved, node_id: str) -> bytes:
    return orjson.dumps(
        {
            "token_hash": saved.token_hash.hex(),
            "capabilities": orjson.Fragment(saved.capabilities),
            "acks": saved.acks,
            "node": node_id,
        }
    )


def decode_agent(agent_id: str, value: bytes) -> tuple[AgentSaved, str]:
    """The registration a KV value holds and the node that wrote it, the agent's home (raises
    ValueError/KeyError/TypeError if it is not what `encode_agent` wrote)."""
    data = orjson.loads(value)
    saved = AgentSaved(
        agent_id,
        bytes.fromhex(data["token_hash"]),
        orjson.dumps(data["capabilities"]),
        bool(data["acks"]),
    )
    return saved, str(data["node"])
