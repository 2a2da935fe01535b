"""What handover and adoption use of a node's router, as a narrow interface: the router's
entry points for a node (`between_nodes`) call them with themselves, and neither imports it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from lobby.core.commerce.marketplace import Marketplace
    from lobby.core.commerce.negotiation import Negotiations
    from lobby.core.conversations import Conversations
    from lobby.core.records import Record
    from lobby.core.session import Action
    from lobby.core.state import LobbyState


class RouterParts(Protocol):
    """The state and handlers an agent's conversations, dialogues and proposals live in."""

    state: LobbyState
    requests: Conversations
    negotiations: Negotiations
    market: Marketplace
    given_up: dict[str, list[Record]]

    def looked_up(self, agent_id: str) -> list[Action]: ...
