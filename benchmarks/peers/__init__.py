"""`make bench-peers`: the same request/response and one-way patterns through the dumb relay,
the durable lobby, SPADE (XMPP) and the AutoGen gRPC runtime, in one run (`__main__`)."""
