"""Commerce: negotiation between agents (CFP, proposals, sealed bids) and the marketplace's
orders and payments."""
