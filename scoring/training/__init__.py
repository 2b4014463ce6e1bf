"""Offline: MovieLens and synthetic data, training, and evaluation (AUC/GAUC)."""
