"""The sans-I/O core: the lobby's state and decisions, with no await, socket or file."""

from lobby.core.router import Router
from lobby.core.session import Action, Close, Send, Session

__all__ = ["Action", "Close", "Router", "Send", "Session"]
