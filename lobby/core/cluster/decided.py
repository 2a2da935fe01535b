"""Cluster only: messages another lobby node decided, delivered here at their receiver's home.

A dialogue lives on one node (its initiator's home), a proposal on its proposer's home
(`lobby.core.commerce.negotiation`, `lobby.core.commerce.marketplace`). That node checks each move
or payment, changes the dialogue or proposal, records the trade, and sends the counterpart's home
the move, and each party's home its notices, already decided: the home neither checks them again nor
tracks the dialogue; it stamps, stores, dedupes and delivers them as any message of its agent's,
and confirms it to the deciding node after its commit (`lobby.done`: that node tells the sender
ACCEPTED, `lobby.core.accepting`).
A TRANSACTION_CONFIRMED or PAYMENT_CONFIRMED also enters this node's ledger, so LIST_TRANSACTIONS
answers a party from its own home. Sans-I/O.
"""

from __future__ import annotations

from typing import Final

from lobby.core.records import Effect
from lobby.core.session import Action, Session
from lobby.core.state import LobbyState
from protocol.codec import decode
from protocol.errors import DecodeError
from protocol.models import MessageType

_TRADES: Final = frozenset({MessageType.TRANSACTION_CONFIRMED, MessageType.PAYMENT_CONFIRMED})


def deliver_decided(
    state: LobbyState, session: Session | None, frame: bytes
) -> list[Action] | None:
    """Store and deliver `frame`, decided on another node, to its receiver here. `session`
    stands for its sender on that node (None: a lobby notice). None: the receiver is not this
    node's agent (any more), and the deciding node keeps the message to send to its new home."""
    try:
        msg = decode(frame)
    except DecodeError:
        return []  # never expected: a node forwards only frames it encoded itself
    target = state.registry.agents.get(msg.receiver_id)
    if target is None:
        return []  # removed meanwhile: nobody left to deliver it to
    if target.home is not None:
        return None
    delivery = state.delivery
    now = state.clock()
    if delivery.is_duplicate(msg, session, now):
        return []  # a resend: confirmed again, never delivered twice
    if session is None and msg.message_id is not None:
        # `accept` records the senders' ids, not the lobby's own notices'.
        delivery.seen[(msg.sender_id, msg.message_id)] = now
    if msg.message_type in _TRADES:
        tx = msg.payload.get("transaction")
        if isinstance(tx, dict):
            state.record(tx)  # once: both parties' notices may come here
    return state.deliver(target, msg, session, Effect.NONE, now, force=True)
