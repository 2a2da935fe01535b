"""agent_sdk/core.py's route table: each layer adds the routes of the message types it
handles in its `__init__`; a type without a route goes to `on_message`."""

from __future__ import annotations

from agent_sdk import Agent, Bidder
from agent_sdk.core import AgentCore
from protocol.models import MessageType

ROUTED = {
    MessageType.REQUEST,  # serving
    MessageType.CANCEL,
    MessageType.INPUT,  # serving: the answer to a handler's ask
    MessageType.CFP,  # negotiation
    MessageType.PROPOSE,
    MessageType.ACCEPT,
    MessageType.DECLINE,
    MessageType.MATCH_ACCEPT,
    MessageType.TRANSACTION_CONFIRMED,
    MessageType.DIALOGUE_EXPIRED,
    MessageType.BIDS_REVEALED,
    MessageType.ERROR,  # a refused sealed round fails its cfp(), a WATCH its watch; on_message
    MessageType.TEXT,  # marketplace
    MessageType.ORDER_PROPOSAL,
    MessageType.PAYMENT,
    MessageType.PAYMENT_CONFIRMED,
    MessageType.PRESENCE,  # presence
}


def test_every_layer_registers_its_routes_once_and_only_its_own() -> None:
    assert set(Agent("a", token_store=None)._routes) == ROUTED
    assert set(Bidder("b", token_store=None)._routes) == ROUTED
    assert AgentCore("c", token_store=None)._routes == {}  # everything goes to on_message


def test_each_agent_object_has_its_own_table() -> None:
    first, second = Agent("a", token_store=None), Agent("b", token_store=None)
    assert first._routes is not second._routes
    assert getattr(second._routes[MessageType.REQUEST], "__self__", None) is second
