"""The Agent Lobby daemon: a WebSocket message router for autonomous agents.

The package itself exports nothing, so that importing one layer loads only that layer (the
sans-I/O core must load no store and no socket library). Its parts: `lobby.core` (the router and
its state), `lobby.store` (persistence), `lobby.transport` (connections), `lobby.server` (the
I/O layer that drives them), `lobby.cli` (`lobby serve`).
"""

__all__: list[str] = []
