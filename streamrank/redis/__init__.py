"""Redis: client construction (standalone, Sentinel, Cluster), the one translation of Redis failures into our error tree, command packing, and slot-grouped pipelines."""
