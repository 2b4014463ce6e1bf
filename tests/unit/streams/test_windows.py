from types import SimpleNamespace

from streams.windows import (
    Window,
    bucket_expire_at_ms,
    bucket_start,
    window_buckets,
    windows_from_settings,
)


def test_bucket_start_floors_event_time() -> None:
    assert bucket_start(1_000_299_999, 300) == 1_000_200
    assert bucket_start(1_000_200_000, 300) == 1_000_200
    assert bucket_start(0, 300) == 0


def test_window_buckets_cover_the_window_to_bucket_granularity() -> None:
    w = Window("1h", 3600, 300)
    now_ms = 10_000 * 1000 + 1  # 10000 s + 1 ms; buckets start at multiples of 300
    got = window_buckets(now_ms, w)
    assert got[0] == 6300  # holds now - 3600 = 6400
    assert got[-1] == 9900  # holds now
    assert got == list(range(6300, 9901, 300))
    assert len(got) == 13


def test_window_buckets_on_a_boundary_skip_the_bucket_that_ended() -> None:
    w = Window("1h", 3600, 300)
    got = window_buckets(7200 * 1000, w)
    assert got[0] == 3600 and got[-1] == 7200 and len(got) == 13


def test_bucket_expiry_is_end_plus_window_plus_lateness() -> None:
    w = Window("24h", 86400, 3600)
    assert bucket_expire_at_ms(3600, w, 600) == (3600 + 3600 + 86400 + 600) * 1000


def test_windows_from_settings() -> None:
    fine, coarse = windows_from_settings(
        SimpleNamespace(counter_bucket_s=60, counter_coarse_bucket_s=1800)
    )
    assert (fine.name, fine.length_s, fine.resolution_s) == ("1h", 3600, 60)
    assert (coarse.name, coarse.length_s, coarse.resolution_s) == ("24h", 86400, 1800)
