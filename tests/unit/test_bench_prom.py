"""The benchmark's /metrics reader: counters summed and differenced, histogram
quantiles interpolated inside buckets, absent families reported as None."""

from __future__ import annotations

from bench import _prom

BEFORE = """\
# HELP x_seconds a histogram
x_seconds_bucket{queue="a",le="0.01"} 1.0
x_seconds_bucket{queue="a",le="0.1"} 1.0
x_seconds_bucket{queue="a",le="+Inf"} 1.0
c_total{kind="select"} 10.0
"""
AFTER = """\
x_seconds_bucket{queue="a",le="0.01"} 11.0
x_seconds_bucket{queue="a",le="0.1"} 31.0
x_seconds_bucket{queue="a",le="+Inf"} 31.0
c_total{kind="select"} 25.0
c_total{kind="insert"} 5.0
"""


def test_counters_sum_and_difference() -> None:
    before, after = _prom.parse(BEFORE), _prom.parse(AFTER)
    assert _prom.total(after, "c_total") == 30.0
    assert _prom.delta(before, after, "c_total") == 20.0
    assert _prom.delta(before, after, "c_total", kind="insert") == 5.0
    assert _prom.delta(before, after, "missing_total") is None


def test_quantiles_interpolate_inside_the_bucket_of_the_window() -> None:
    before, after = _prom.parse(BEFORE), _prom.parse(AFTER)
    # 30 observations in the window: 10 under 10 ms, 20 between 10 and 100 ms
    assert abs(_prom.quantile(before, after, "x_seconds", 0.5) - 0.0325) < 1e-9  # type: ignore[operator]
    assert abs(_prom.quantile(before, after, "x_seconds", 0.2) - 0.006) < 1e-9  # type: ignore[operator]
    assert _prom.quantile(after, after, "x_seconds", 0.5) is None  # nothing observed
    assert _prom.quantile(before, after, "y_seconds", 0.5) is None
