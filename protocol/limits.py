"""Length limits on identifiers and names.

A frame may be as large as the lobby allows (256 KiB by default), but nothing that names a
thing needs to be: the limits below are checked where each field is read (`codec.decode` for
the envelope, the `Capability` model for names), so no id the lobby stores, indexes or quotes
grows with the frame.
"""

from __future__ import annotations

from typing import Final

# Generous but sane: a UUID is 36 characters, a ULID 26, and composed ids such as
# "tenant:agent:uuid" stay well under 256. Any id is then at most 1/1000 of a frame, which keeps
# dedupe keys, journal rows and the ids quoted back in ERRORs small.
MAX_AGENT_ID_LENGTH: Final = 128
"""`sender_id`, `receiver_id`, `authorized_requester_ids` entries: the agent id rule (REGISTER
accepts 1-128 characters), so a longer one can never name an agent."""
MAX_ID_LENGTH: Final = 256
"""`conversation_id`, `message_id`, `in_reply_to`, and `auth_token` (a UUID4, 36 characters)."""
MAX_NAME_LENGTH: Final = 256
"""Capability names, keywords and attribute keys."""
