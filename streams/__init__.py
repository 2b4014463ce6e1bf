"""Real-time feature streams: a Faust worker keeps behaviour sequences and windowed counters
in Redis; ``FeatureReader`` (``streams.reader``) serves them to the scoring side."""
