"""Named steps of a cluster node's rarer work (a handover, a failover) where a fault test stops
this process: with `LOBBY_STOP_AT=<step>` in its environment, the process sends itself SIGSTOP
on reaching that step, so the test can SIGKILL it exactly there, not after a guessed sleep.
Unset (always, outside tests) `reached` is one comparison on paths taken a few times a day.

The steps, in the order a handover takes them:
- `handover_released`: the old home has given the agent up in memory; nothing answered yet;
- `handover_committed`: what the old home journaled with the release is committed; its answer
  is still to be sent;
- `handover_answered`: the old home has sent its handover to the new node;
- `handover_adopted`: the new node has adopted it in memory; its commit and its confirmation
  to the old home (the second phase) are still to come.
"""

from __future__ import annotations

import os
import signal
import sys
from typing import Final

STOP_AT: Final = os.environ.get("LOBBY_STOP_AT")


def reached(step: str) -> None:
    """Stop this process here if the environment names `step` (a test SIGKILLs it)."""
    if step == STOP_AT:
        sys.stdout.flush()
        os.kill(os.getpid(), signal.SIGSTOP)
