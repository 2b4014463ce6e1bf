"""Embedding rows in Redis (compressed, versioned) and the local hot-row cache in front of them."""
