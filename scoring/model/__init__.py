"""The DIN model, its artifacts, and publishing, activating and deleting versions in Redis."""
