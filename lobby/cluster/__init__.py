"""Lobby nodes sharing one world through NATS (`lobby serve --cluster URLS --node-id N`).

`node.ClusterNode` owns the node's NATS connection on the lobby's event loop and carries the
core's cluster actions out (`lobby.core.cluster.shared`); `keys` is the shared registry's wire form,
`routing` carries messages between nodes, `liveness` says which nodes are up and `recovery`
fails a dead node's agents over to a survivor.
The durable journal is `lobby.store.jetstream`, on a connection of its own.
"""
