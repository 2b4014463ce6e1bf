"""The one wall clock of the engine: epoch milliseconds, the unit of every timestamp in the
message contracts and in Redis."""

from __future__ import annotations

import time


def now_ms() -> int:
    """Now, in epoch milliseconds."""
    return int(time.time() * 1000)
