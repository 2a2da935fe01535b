"""Discovery: the registry of agents and capabilities, and the answers to DISCOVER_SERVICES
(exact lookups, filters, ranked search, pages)."""
