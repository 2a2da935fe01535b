"""What only a node of a cluster runs: frames between nodes, handover and adoption of an
agent's conversations, decisions taken once, and the registry shared through the cluster."""
