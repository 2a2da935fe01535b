"""The Agent Lobby daemon: a WebSocket message router for autonomous agents."""
