"""Cluster only: an agent's state handed over when it resumes on another live node. Sans-I/O.

A resume of an agent whose home is another node that is up waits (`SharedRegistry.release`)
while its new node asks the old home to release it. The old home (`release`) closes the
agent's connection there with 4001, gives up what it held for the agent and decided for it,
journals that, and answers, once that is committed, with a `Snapshot` of the agent alone:
- its registration, sequence numbers and the messages it has not acknowledged (their
  (sender, message_id) go along, so a resend of one is still recognised);
- the open REQUEST conversations it is a party to, and which of them wait for input (copied:
  the old home may still hold the other party);
- the dialogues and sealed rounds it started, the order proposals it made (the old home
  forgets them: they are decided by their initiator's or proposer's home) and its trades.
The new node adopts it as a failover adopts a dead node's agents (`lobby.core.cluster.adoption`),
then lets the resume go ahead, which replays the mailbox in order.

Two phases: the old home stops serving the agent at the release, but journals that it gave
the agent up only once the new home says its adoption is committed (`released`). Until then
the old home's journal still holds the mailbox, so a failover of the old home at any step
finds the agent's messages either there or on the new home, never on neither (an agent the
new home adopted is that node's, and the failover leaves it alone).

From the release on, the old home holds what is sent to the agent there until the new home has
written the agent's key, then forwards it. Should the new home never take the agent (it gave
up waiting), or die before confirming its adoption, the old home takes its own handover back
(`take_back`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import orjson
import structlog

from lobby.core.cluster.adoption import adopt
from lobby.core.commerce.sealed import KIND
from lobby.core.multiturn import WAITING
from lobby.core.records import (
    Acked,
    AgentSaved,
    Effect,
    MessageStored,
    Record,
    Snapshot,
    StateRemoved,
)
from lobby.core.session import Action, Close
from protocol.models import CloseCode

if TYPE_CHECKING:
    from lobby.core.cluster.parts import RouterParts

log = structlog.get_logger("lobby")


def release(router: RouterParts, agent_id: str, to_node: str) -> tuple[bytes, list[Action]]:
    """Give `agent_id` up to node `to_node`: the handover (empty if it is not this node's
    agent) and the close of its connection here. Answer with it only once the journal is
    committed."""
    state = router.state
    record = state.registry.get(agent_id)
    if record is None or record.home is not None:
        return b"", []
    actions: list[Action] = []
    session, record.session = record.session, None
    if session is not None:
        session.agent = None
        reason = f"replaced by a newer connection on node {to_node}"
        actions.append(Close(session, CloseCode.REPLACED, reason))
    now = state.clock()
    rows = []
    for n, (seq, frame) in enumerate(record.mailbox, start=1):
        msg = orjson.loads(frame)
        rows.append(
            [n, seq, msg["sender_id"], msg["message_id"], msg.get("conversation_id"), now, frame]
        )
    conversations = [
        [*key, count] for key, count in router.requests.open.items() if agent_id in key[:2]
    ]
    negotiations, market = router.negotiations, router.market
    dialogues = [d for d in negotiations.dialogues.values() if d.initiator == agent_id]
    rounds = [r for r in negotiations.sealed.rounds.values() if r.buyer == agent_id]
    proposals = [p for p in market.proposals.values() if p.sender_id == agent_id]
    trades = state.ledger.of(agent_id)
    capabilities = orjson.dumps([entry.wire for entry in record.capabilities.values()])
    data = orjson.dumps(
        {
            "agent": [
                agent_id,
                record.token_hash.hex(),
                orjson.Fragment(capabilities),
                record.acks,
            ],
            "acked": record.acked_seq,
            "messages": [[*row[:6], orjson.Fragment(row[6])] for row in rows],
            "conversations": conversations,
            "state": {
                "dialogue": [d.to_dict() for d in dialogues],
                KIND: [r.to_dict() for r in rounds],
                "proposal": [p.to_dict() for p in proposals],
                "transaction": trades,
                WAITING: [key for key in router.requests.turns.waiting if agent_id in key[:2]],
            },
        }
    )
    # Given up here; journaled so once the new home's adoption is committed (`released`). What
    # is sent to it here from now on waits (`SharedRegistry.park`) until its new home has
    # taken it (`Router.looked_up`, once that node wrote its key), so nothing overtakes it there.
    record.home = to_node
    if state.shared is not None:
        state.shared.hold(agent_id)
    record.mailbox.clear()
    record.acked_seq = record.delivered_seq = record.next_seq
    given_up: list[Record] = [Acked(agent_id, record.next_seq)]
    for dialogue in dialogues:
        negotiations.give_up(dialogue)
        given_up.append(StateRemoved("dialogue", dialogue.dialogue_id))
    for sealed in rounds:
        del negotiations.sealed.rounds[sealed.round_id]
        given_up.append(StateRemoved(KIND, sealed.round_id))
    for proposal in proposals:
        del market.proposals[proposal.message_id]
        given_up.append(StateRemoved("proposal", proposal.message_id))
    router.given_up[agent_id] = given_up
    log.info(
        "AGENT_RELEASED",
        agent_id=agent_id,
        node_id=to_node,
        held_messages=len(rows),
        dialogues=len(dialogues),
        proposals=len(proposals),
    )
    return data, actions


def released(router: RouterParts, agent_id: str) -> None:
    """The node `agent_id` was handed to has committed its adoption: what this node gave up
    (`release`) is journaled as gone, and a restart or failover of this node holds none of it."""
    given_up = router.given_up.pop(agent_id, None)
    if given_up is not None:
        router.state.delivery.journal.extend(given_up)


def take_over(router: RouterParts, home: str, data: bytes) -> list[str]:
    """Adopt what node `home` handed over (`release`) for an agent whose home it still is
    here; returns the agent's id if it was adopted."""
    if not data:
        return []
    handover: dict[str, Any] = orjson.loads(data)
    agent_id, token_hash, capabilities, acks = handover["agent"]
    rows = [
        MessageStored(
            row_id,
            agent_id,
            seq,
            sender,
            message_id,
            conversation_id,
            Effect.NONE,
            orjson.dumps(frame),
            at,
        )
        for row_id, seq, sender, message_id, conversation_id, at, frame in handover["messages"]
    ]
    state = handover["state"]
    snapshot = Snapshot(
        agents=[AgentSaved(agent_id, bytes.fromhex(token_hash), orjson.dumps(capabilities), acks)],
        acked={agent_id: handover["acked"]},
        messages=rows,
        conversations={(r, s, c): n for r, s, c, n in handover["conversations"]},
        conversations_upto=len(rows),
        state={kind: [orjson.dumps(d) for d in docs] for kind, docs in state.items()},
    )
    return adopt(router, snapshot, home)


def take_back(router: RouterParts, to_node: str, data: bytes) -> list[Action]:
    """Node `to_node` never took the agent this node handed it (`release`): adopt the handover
    here again and route what waited for it."""
    agent_id = orjson.loads(data)["agent"][0]
    released(router, agent_id)  # its journal then holds the handover once, as adopted here
    if take_over(router, to_node, data):
        log.warning("AGENT_TAKEN_BACK", agent_id=agent_id, node_id=to_node)
    return router.looked_up(agent_id)  # here again, or wherever its key now says
