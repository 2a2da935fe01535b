"""Bridges between the lobby and other agent protocols (the `bridges` extra, `make run
EXTRAS=bridges`).

    mcp         lobby agents as MCP tools (`lobby mcp`), MCP servers as lobby agents
                (`lobby bridge mcp`), with the official `mcp` SDK
    a2a         lobby agents as A2A agents (`lobby a2a serve`), A2A agents as lobby agents
                (`lobby a2a join`), with the official `a2a-sdk`

Each bridge is an SDK agent: the lobby's authentication, authorization and checks apply to
what crosses it exactly as to any other agent. A package on top of the SDK and the lobby:
neither imports it; `lobby` finds its commands (`mcp_commands`, `a2a_commands`) through the
`lobby.commands` entry points.
"""
