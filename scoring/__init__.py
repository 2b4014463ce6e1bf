"""The scoring half: embeddings, model, training and serving stages, and the RankClient."""
