"""Tests of the log-linear histogram: bucket function, percentiles against raw samples, merge."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from otel_lockwatch.record._histogram import (
    MAX_BUCKETS,
    RELATIVE_ERROR,
    LogHistogram,
    bucket_bounds,
    bucket_of,
    from_buckets,
    nearest_rank,
)

# Values spread over every magnitude up to 64 bits, with small values (the exact range) well
# represented.
values = st.one_of(
    st.integers(0, 40),
    st.integers(0, 10**6),
    st.integers(0, 2**64 - 1),
)
samples = st.lists(values, min_size=1, max_size=200)
quantiles = st.integers(0, 1000).map(lambda i: i / 1000)


def exact_percentile(raw: list[int], q: float) -> int:
    ordered = sorted(raw)
    return ordered[nearest_rank(q, len(ordered)) - 1]


def test_bucket_of_is_exact_below_32_and_contiguous():
    """Values 0..31 have their own bucket; bucket indices never skip one."""
    assert [bucket_of(v) for v in range(32)] == list(range(32))
    assert bucket_of(32) == 32
    assert bucket_of(2**64 - 1) == MAX_BUCKETS - 1 == 975
    for i in range(MAX_BUCKETS - 1):
        low, high = bucket_bounds(i)
        assert bucket_of(low) == i and bucket_of(high) == i
        assert bucket_bounds(i + 1)[0] == high + 1


@given(values)
def test_bucket_bounds_contain_the_value_and_are_narrow(v):
    """Every value lies in its bucket's bounds, whose width is at most 1/16 of the lower bound."""
    low, high = bucket_bounds(bucket_of(v))
    assert low <= v <= high
    if v >= 32:
        assert (high - low + 1) * 16 <= low


def test_bucket_bounds_rejects_negative_index():
    with pytest.raises(ValueError, match=r"^bucket index must be >= 0, got -1$"):
        bucket_bounds(-1)


def test_nearest_rank_is_not_fooled_by_binary_floats():
    """0.07 * 100 is 7.000000000000001 in floating point; the rank is still 7."""
    assert nearest_rank(0.07, 100) == 7
    assert nearest_rank(0.0, 10) == 1
    assert nearest_rank(1.0, 10) == 10
    assert nearest_rank(0.5, 3) == 2


@settings(max_examples=300)
@given(samples, quantiles)
def test_percentile_is_within_the_stated_error_of_the_exact_one(raw, q):
    """The reported percentile is within RELATIVE_ERROR (1/32) of the raw nearest-rank one."""
    h = LogHistogram(raw)
    exact = exact_percentile(raw, q)
    assert abs(h.percentile(q) - exact) <= RELATIVE_ERROR * exact


@given(samples)
def test_count_sum_min_max_are_exact(raw):
    h = LogHistogram(raw)
    assert (h.count, h.sum, h.min, h.max) == (len(raw), sum(raw), min(raw), max(raw))
    assert min(raw) <= h.percentile(0) <= h.percentile(1) <= max(raw)


def test_small_values_are_exact():
    """Below 32 every percentile is exactly a sample."""
    h = LogHistogram(range(1, 31))
    assert [h.percentile(q) for q in (0.1, 0.5, 0.9)] == [3, 15, 27]


def test_midpoint_reporting():
    """A value in a wide bucket is reported as the bucket's midpoint (clamped to min/max)."""
    h = LogHistogram([1000, 1000, 1000, 5000])
    low, high = bucket_bounds(bucket_of(1000))
    assert (low, high) == (992, 1023)
    assert h.percentile(0.5) == 1008
    assert h.percentile(1.0) == 4992  # the midpoint of 5000's bucket [4864, 5119]
    assert LogHistogram([1000]).percentile(0.5) == 1000  # clamped to [min, max]


def test_empty_histogram_reports_zero():
    h = LogHistogram()
    assert h.percentile(0.5) == 0
    assert h.to_json() == {"sub_bits": 4, "buckets": [], "count": 0, "sum": 0, "min": 0, "max": 0}


@pytest.mark.parametrize("q", [-0.1, 1.5, float("nan")])
def test_percentile_rejects_quantiles_outside_0_1(q):
    with pytest.raises(ValueError, match=r"^quantile must be in \[0, 1\], got "):
        LogHistogram([1]).percentile(q)


def test_add_rejects_negative_and_non_integer_values():
    h = LogHistogram()
    with pytest.raises(ValueError, match=r"^value must be >= 0, got -5$"):
        h.add(-5)
    with pytest.raises(TypeError, match=r"^value must be an int, got 1\.5$"):
        h.add(1.5)
    with pytest.raises(ValueError, match=r"^n must be >= 0, got -1$"):
        h.add_n(3, -1)
    assert h.count == 0


@given(values, st.integers(0, 50))
def test_add_n_equals_n_adds(v, n):
    one = LogHistogram()
    one.add_n(v, n)
    assert one == LogHistogram([v] * n)


@given(samples, samples, samples)
def test_merge_is_associative_and_commutative(a, b, c):
    ha, hb, hc = LogHistogram(a), LogHistogram(b), LogHistogram(c)
    assert ha.merged(hb) == hb.merged(ha)
    assert ha.merged(hb).merged(hc) == ha.merged(hb.merged(hc))


@given(samples, samples)
def test_merge_equals_adding_all_samples_to_one_histogram(a, b):
    ha = LogHistogram(a)
    ha.merge(LogHistogram(b))
    assert ha == LogHistogram(a + b)


@given(samples)
def test_merging_with_itself_doubles_counts_and_keeps_percentiles(raw):
    h = LogHistogram(raw)
    doubled = h.merged(h)
    assert doubled.count == 2 * h.count and doubled.sum == 2 * h.sum
    for q in (0.0, 0.5, 0.95, 0.99, 1.0):
        assert doubled.percentile(q) == h.percentile(q)


def test_merge_with_empty_keeps_min_and_max():
    h = LogHistogram([7, 9])
    assert LogHistogram().merged(h) == h
    assert h.merged(LogHistogram()) == h


def test_merge_rejects_other_types():
    with pytest.raises(TypeError, match=r"^can only merge a LogHistogram, got dict$"):
        LogHistogram().merge({})


@given(st.lists(values, max_size=100))
def test_json_round_trip(raw):
    h = LogHistogram(raw)
    text = json.dumps(h.to_json())
    assert LogHistogram.from_json(json.loads(text)) == h


def test_to_json_buckets_are_sorted_pairs():
    assert LogHistogram([40, 3, 3]).to_json()["buckets"] == [[3, 2], [36, 1]]


@pytest.mark.parametrize(
    ("obj", "message"),
    [
        ([], r"^histogram must be an object, got list$"),
        ({"sub_bits": 4}, r"^histogram lacks buckets, count, sum, min, max$"),
        (
            {"sub_bits": 3, "buckets": [], "count": 0, "sum": 0, "min": 0, "max": 0},
            r"^histogram sub_bits must be 4, got 3$",
        ),
        (
            {"sub_bits": 4, "buckets": [], "count": -1, "sum": 0, "min": 0, "max": 0},
            r"^histogram count must be an int >= 0, got -1$",
        ),
        (
            {"sub_bits": 4, "buckets": [[3]], "count": 1, "sum": 3, "min": 3, "max": 3},
            r"^histogram bucket must be \[index, count\], got \[3\]$",
        ),
        (
            {"sub_bits": 4, "buckets": [[5, 1], [3, 1]], "count": 2, "sum": 8, "min": 3, "max": 5},
            r"^histogram bucket indices must ascend within \[0, 976\), got 3$",
        ),
        (
            {"sub_bits": 4, "buckets": [[3, 0]], "count": 0, "sum": 0, "min": 0, "max": 0},
            r"^histogram bucket 3 count must be > 0, got 0$",
        ),
        (
            {"sub_bits": 4, "buckets": [[3, 2]], "count": 1, "sum": 3, "min": 3, "max": 3},
            r"^histogram count 1 differs from its buckets' total 2$",
        ),
        (
            {"sub_bits": 4, "buckets": [[3, 1]], "count": 1, "sum": 3, "min": 4, "max": 4},
            r"^histogram min 4 / max 4 fall outside its buckets$",
        ),
        (
            {"sub_bits": 4, "buckets": [[3, 2]], "count": 2, "sum": 99, "min": 3, "max": 3},
            r"^histogram sum 99 is impossible for 2 samples in \[3, 3\]$",
        ),
    ],
)
def test_from_json_rejects_bad_data(obj, message):
    with pytest.raises(ValueError, match=message):
        LogHistogram.from_json(obj)


def test_size_is_bounded_whatever_the_number_of_samples():
    h = LogHistogram()
    for shift in range(64):
        for k in range(64):
            h.add(((k + 64) << shift) >> 6)
    assert len(h.counts) <= MAX_BUCKETS


def test_a_snapshot_between_a_first_samples_two_writes_counts_it():
    """The pure-Python path adds a release's hold to the total, then to its bucket: a snapshot
    in between reads a total with no bucket. That sample is the total, and the histogram counts
    it (its sum is what the timeline sampled), valid as a manifest's histogram must be."""
    h = from_buckets({}, 1_741_184, 0, 0)
    assert (h.count, h.sum, h.min, h.max) == (1, 1_741_184, 1_741_184, 1_741_184)
    assert LogHistogram.from_json(h.to_json()).to_json() == h.to_json()
    assert from_buckets({}, 0, 0, 0).count == 0  # nothing recorded: empty
