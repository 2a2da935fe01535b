"""Failover, the core's part: adopt the agents of a dead cluster node from its durable state.

The node that won a dead node's recovery (`lobby.cluster.recovery`) loads that node's snapshot
plus journal (the same `Snapshot` a restart reads) and hands it to `adopt`, which rebuilds it
as a restart would (`Delivery.restore`, `Conversations.restore`) into a scratch state and
moves into this node's core what belongs to the agents whose home is still the dead node:
mailboxes, sequence numbers, what they acknowledged, the dedupe window and open conversations;
and what the dead node decided (dialogues, sealed rounds, order proposals, its ledger), which
this node decides from then on.
They become this node's agents (offline until they resume), journaled here as a restart of
this node needs them, and their registration is queued for the shared registry, which makes
this node their home everywhere. Sans-I/O, like the rest of the core.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import orjson

from lobby.core.commerce.sealed import KIND
from lobby.core.conversations import Conversations
from lobby.core.records import DELIVERED, Acked, MessageStored, Snapshot, StateSaved
from lobby.core.session import AgentRecord
from lobby.core.state import LobbyState

if TYPE_CHECKING:
    from lobby.core.cluster.parts import RouterParts


def adopt(router: RouterParts, snapshot: Snapshot, dead: str) -> list[str]:
    """Take over the agents of node `dead` whose home it still is, from its `snapshot`; returns
    their ids. Call once per dead node, from the node that won its recovery."""
    state = router.state
    delivery = state.delivery
    # Only restored into: `restore` reads the snapshot's rows and marks, none of the scratch
    # state's limits, clock or tokens.
    scratch = LobbyState(mailbox_limit=delivery.mailbox_limit)  # pragma: no mutate
    for saved in snapshot.agents:
        scratch.registry.add(AgentRecord(saved.agent_id, saved.token_hash))  # pragma: no mutate
    scratch.delivery.restore(snapshot, scratch.registry.agents)
    conversations = Conversations(scratch)
    conversations.restore(snapshot)

    registry = state.registry
    adopted: dict[str, AgentRecord] = {}
    for agent_id, restored in scratch.registry.agents.items():
        record = registry.get(agent_id)
        if record is None or record.home != dead:
            continue  # removed, or resumed on a live node meanwhile: not the dead node's
        record.next_seq = restored.next_seq
        record.acked_seq = restored.acked_seq
        record.delivered_seq = restored.delivered_seq
        record.mailbox = restored.mailbox
        record.home = None
        state.save(record)  # journaled, and written to the shared registry: its home is here
        adopted[agent_id] = record
    # What a restart of this node needs: the rows (held frames; ids kept for dedupe) and marks.
    for row in snapshot.messages:
        record = adopted.get(row.receiver)
        if record is None:
            continue
        delivery.last_row += 1
        delivery.journal.append(
            MessageStored(
                delivery.last_row,
                row.receiver,
                row.seq,
                row.sender,
                row.message_id,
                row.conversation_id,
                row.effect,
                row.frame if row.seq > record.acked_seq else DELIVERED,
                row.at,
            )
        )
    delivery.journal.extend(Acked(agent_id, r.acked_seq) for agent_id, r in adopted.items())
    _take_decisions(router, snapshot)
    delivery.seen.update(scratch.delivery.seen)
    open_here = router.requests.open
    for key, count in conversations.open.items():
        if key in open_here:
            continue  # a conversation across the two nodes: tracked here already
        open_here[key] = count
        requester = registry.get(key[0])
        if requester is not None:
            requester.open_requests += count
    for key in conversations.turns.waiting:
        router.requests.turns.asked(key)  # journaled: a restart here keeps the wait
    return list(adopted)


def _take_decisions(router: RouterParts, snapshot: Snapshot) -> None:
    """The dead node's dialogues, sealed rounds, proposals and trades: it decided them (each
    lives on its initiator's or proposer's home, `lobby.core.commerce.negotiation`), and this node,
    now those agents' home, decides them from here on. What this node holds already is kept."""
    state = router.state
    documents = snapshot.state
    known = state.ledger.ids
    trades = [orjson.loads(t) for t in documents.get("transaction", [])]
    trades = [t for t in trades if t["transaction_id"] not in known]
    for tx in trades:
        state.record(tx)
    negotiations, market = router.negotiations, router.market
    taken = {
        "dialogue": _new(documents.get("dialogue", []), "dialogue_id", negotiations.dialogues),
        KIND: _new(documents.get(KIND, []), "round_id", negotiations.sealed.rounds),
        "proposal": _new(documents.get("proposal", []), "message_id", market.proposals),
    }
    negotiations.restore([d for _, d in taken["dialogue"]])
    negotiations.restore_rounds([d for _, d in taken[KIND]])
    market.restore([d for _, d in taken["proposal"]], trades)
    for kind, kept in taken.items():
        state.delivery.journal.extend(StateSaved(kind, key, document) for key, document in kept)


def _new(documents: list[bytes], field: str, held: Mapping[str, object]) -> list[tuple[str, bytes]]:
    """(key, document) of each saved document whose key `field` names nothing held here."""
    found = [(str(orjson.loads(d)[field]), d) for d in documents]
    return [(key, d) for key, d in found if key not in held]
