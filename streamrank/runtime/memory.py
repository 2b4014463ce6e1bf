"""The C allocator's settings for processes that allocate large, short-lived tensors.

glibc hands freed memory at the top of the heap back to the kernel once it exceeds a trim
threshold, and serves allocations above a threshold with fresh mappings; both adapt to a few
MB at most. A forward's intermediates are MB-sized and freed on every call, so by default each
call maps and page-faults them in again. :func:`retain_freed_memory` fixes both thresholds.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging

logger = logging.getLogger(__name__)

_M_TRIM_THRESHOLD = -1  # mallopt parameters (malloc.h)
_M_MMAP_THRESHOLD = -3


_MMAP_THRESHOLD_MAX = 32 << 20  # glibc's upper limit on 64-bit hosts


def retain_freed_memory(mb: int) -> bool:
    """Keep up to ``mb`` MB of freed heap for reuse and serve allocations up to ``mb / 4`` MB
    (at most 32) from the heap; False (nothing changed) when ``mb`` is 0 or there is no
    glibc."""
    if mb <= 0:
        return False
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError, TypeError):
        logger.info("the C library has no mallopt (not glibc): allocator settings unchanged")
        return False
    trim = mb << 20
    done = bool(mallopt(_M_MMAP_THRESHOLD, min(trim // 4, _MMAP_THRESHOLD_MAX))) and bool(
        mallopt(_M_TRIM_THRESHOLD, trim)
    )
    if not done:
        logger.warning("mallopt refused the allocator thresholds (%s MB): unchanged", mb)
    return done
