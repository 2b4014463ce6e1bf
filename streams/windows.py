"""Time buckets and sliding windows of the click counters (pure functions, no I/O).

An event counts into the bucket that holds its event time, at two resolutions: fine buckets
(``counter_bucket_s``) answer the 1 h windows, coarse buckets (``counter_coarse_bucket_s``) the
24 h windows and the per-category counts, so a read touches at most ``window / res + 1``
buckets per entity. A window ending at ``now`` sums the buckets that overlap ``(now - window,
now]``: sliding, to bucket granularity (the oldest bucket may be partly outside the window).

A bucket key expires (PEXPIREAT) at ``bucket end + window + lateness``: until then a window read
at a time up to ``counter_lateness_s`` in the past, or a late event, can still reach it. An
event whose bucket has already passed that point is outside every window: it is not counted
(it is still added to the sequence).
"""

from __future__ import annotations

from dataclasses import dataclass

from streamrank.errors import ConfigError
from streamrank.settings import FeatureSettings


@dataclass(frozen=True, slots=True)
class Window:
    """One counter window: its name in read results, length, and the bucket size it reads."""

    name: str
    length_s: int
    resolution_s: int


def windows_from_settings(features: FeatureSettings) -> tuple[Window, Window]:
    """The 1 h (fine buckets) and 24 h (coarse buckets) windows (each a whole number of buckets,
    so a point-in-time window is exact: :func:`closed_range`)."""
    for length, res in (
        (3600, features.counter_bucket_s),
        (86400, features.counter_coarse_bucket_s),
    ):
        if length % res:
            raise ConfigError(
                f"counter bucket size {res} s does not divide the {length} s window: set "
                "STREAMRANK_COUNTER_BUCKET_S to a divisor of 3600 and "
                "STREAMRANK_COUNTER_COARSE_BUCKET_S to a divisor of 86400"
            )
    return (
        Window("1h", 3600, features.counter_bucket_s),
        Window("24h", 24 * 3600, features.counter_coarse_bucket_s),
    )


def bucket_start(ts_ms: int, resolution_s: int) -> int:
    """Start (epoch s) of the bucket holding event time ``ts_ms``."""
    return (ts_ms // 1000) // resolution_s * resolution_s


def bucket_expire_at_ms(start_s: int, window: Window, lateness_s: int) -> int:
    """When a bucket of ``window``'s resolution can no longer be reached by any read."""
    return (start_s + window.resolution_s + window.length_s + lateness_s) * 1000


def window_buckets(now_ms: int, window: Window) -> list[int]:
    """Starts of the buckets overlapping ``(now - length, now]``, oldest first."""
    res = window.resolution_s
    newest = bucket_start(now_ms, res)
    # The oldest bucket whose end lies after now - length.
    oldest = bucket_start(now_ms - window.length_s * 1000, res)
    return list(range(oldest, newest + 1, res))


def closed_range(as_of_ms: int, window: Window) -> tuple[int, int]:
    """The point-in-time window of a feature read as of ``as_of_ms``: bucket starts ``[lo, hi)``
    (epoch s). Only buckets that closed at or before ``as_of`` count, so no event at or after
    ``as_of`` is ever counted; ``hi - lo`` = the window's length. Equivalently: the events with
    ``lo * 1000 <= ts_ms < hi * 1000`` (the offline training code counts them that way)."""
    hi = bucket_start(as_of_ms, window.resolution_s)
    return hi - window.length_s, hi


def closed_buckets(as_of_ms: int, window: Window) -> range:
    """Starts of the buckets in :func:`closed_range`, oldest first."""
    lo, hi = closed_range(as_of_ms, window)
    return range(lo, hi, window.resolution_s)


def counted_from_ms(ts_ms: int, window: Window) -> int:
    """The earliest as-of time (epoch ms) whose :func:`closed_range` of ``window`` counts an
    event at ``ts_ms``: the end of the event's bucket (it stays counted for one window length
    from then)."""
    return (bucket_start(ts_ms, window.resolution_s) + window.resolution_s) * 1000
