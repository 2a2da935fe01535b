"""Benchmarks: the lobby against a dumb websockets relay, in the same run (`make bench`)."""
