"""streamrank: a real-time feature and scoring engine for recommendation ranking."""

__version__ = "0.1.0"
