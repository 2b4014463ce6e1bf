"""Peers of our benchmarks: what a user would run instead, doing the same work on the same
input, each a small script of its own (never a dependency of streamrank)."""
