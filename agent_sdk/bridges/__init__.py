"""Bridges between the lobby and other agent protocols (MCP, A2A)."""
