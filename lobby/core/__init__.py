"""The sans-I/O core: the lobby's state and decisions, with no await, socket or file."""

from lobby.core.records import Batch
from lobby.core.router import Router
from lobby.core.session import Action, Close, Pause, Send, Session
from lobby.core.state import LobbyState

__all__ = ["Action", "Batch", "Close", "LobbyState", "Pause", "Router", "Send", "Session"]
