"""A mergeable log-linear histogram of non-negative integers (nanoseconds).

The idea (HdrHistogram's, reduced to one line of integer arithmetic): split every power of two
into ``2 ** SUB_BITS`` = 16 equal-width sub-buckets. A value ``v`` with ``b = v.bit_length()``
bits keeps its top ``SUB_BITS + 1`` = 5 bits; the bits shifted away are what the bucket forgets::

    b <= 5        -> bucket v                      (values 0..31 are exact)
    b  > 5        -> shift = b - 5
                     bucket (shift << 4) + (v >> shift)

For ``v >= 32`` the kept mantissa ``v >> shift`` lies in ``[16, 32)``, so a bucket spans
``2**shift`` consecutive values and its lower bound is at least ``16 * 2**shift``: the width is at
most 1/16 of the lower bound. Reporting a value as its bucket's midpoint
``lo + 2**(shift - 1)`` is therefore off by at most ``2**(shift - 1) / lo <= 1/32`` of the true
value (:data:`RELATIVE_ERROR`, 3.125 %). Buckets are numbered contiguously (0..31 exact, then 16
per power of two), so a 64-bit value needs at most 976 buckets: the histogram's size is bounded
whatever the number of samples, which is what lets the recorder keep one per (worker, lock)
and lets manifests of many processes merge exactly (merging is adding bucket counts).

Percentiles are nearest-rank: the ``ceil(q * n)``-th smallest sample, reported as its bucket's
midpoint clamped to the exact ``[min, max]`` seen. ``count``, ``sum``, ``min`` and ``max`` are
exact.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Iterable, Mapping
from itertools import accumulate
from types import ModuleType
from typing import Any

from .._settings import extensions_disabled

__all__ = [
    "MAX_BUCKETS",
    "MERGE_SPEEDUPS",
    "RELATIVE_ERROR",
    "SUB_BITS",
    "LogHistogram",
    "bucket_bounds",
    "bucket_of",
    "from_buckets",
    "nearest_rank",
    "checked_buckets",
]

#: log2 of the number of linear sub-buckets per power of two.
SUB_BITS = 4
# A value keeps its top SUB_BITS + 1 bits (the leading 1 and the sub-bucket), so the values
# below 2 ** (SUB_BITS + 1) keep all of theirs: they are exact, one bucket each.
_KEPT_BITS = SUB_BITS + 1
_EXACT = 1 << _KEPT_BITS
#: Upper bound of the relative error of a reported percentile (1/32 = 3.125 %).
RELATIVE_ERROR = 1 / (2 << SUB_BITS)
#: Number of buckets needed for every 64-bit value (indices 0..975).
MAX_BUCKETS = ((64 - _KEPT_BITS) << SUB_BITS) + _EXACT


def bucket_of(v: int) -> int:
    """Return the bucket index of the non-negative integer ``v`` (values below 32 are exact)."""
    b = v.bit_length()
    if b <= _KEPT_BITS:
        return v
    shift = b - _KEPT_BITS
    return (shift << SUB_BITS) + (v >> shift)


def bucket_bounds(i: int) -> tuple[int, int]:
    """Return the inclusive ``(low, high)`` range of values that fall in bucket ``i``.

    Raises:
        ValueError: ``i`` is negative.
    """
    if i < 0:
        raise ValueError(f"bucket index must be >= 0, got {i!r}")
    if i < _EXACT:
        return i, i
    shift = (i >> SUB_BITS) - 1
    mantissa = i - (shift << SUB_BITS)
    low = mantissa << shift
    return low, low + (1 << shift) - 1


def _midpoint(i: int) -> int:
    if i < _EXACT:
        return i
    shift = (i >> SUB_BITS) - 1
    return ((i - (shift << SUB_BITS)) << shift) + (1 << (shift - 1))


def nearest_rank(q: float, n: int) -> int:
    """Return the 1-based nearest rank ``max(1, ceil(q * n))`` of quantile ``q`` among ``n``.

    ``q * n`` is rounded to 9 decimals first, so that ``0.07 * 100`` (7.000000000000001 in
    binary floating point) is rank 7, not 8.
    """
    return max(1, math.ceil(round(q * n, 9)))


def _load_merge_speedups() -> ModuleType | None:
    """The merge's C fast path (``_merge_speedups.c``: compacting a manifest's text, checking
    and adding bucket counts), or None: not built, or ``LOCKWATCH_DISABLE_EXTENSIONS=1``. The bucket
    functions have their pure-Python references beside the code that calls them; without the
    compacting, a manifest is read the long way (``manifest._io.compact_sealed``)."""
    if extensions_disabled():
        return None
    try:
        from . import _merge_speedups
    except ImportError:
        return None
    return _merge_speedups


#: The ``_merge_speedups`` module, or None.
MERGE_SPEEDUPS = _load_merge_speedups()


def _is_int(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def checked_buckets(buckets: list[Any]) -> dict[int, int] | None:
    """The buckets of a histogram's JSON form as ``{index: count}`` when every pair is well
    formed (the common case of a merge of many manifests: one C call with the merge's fast
    path, else C-level loops); None when one is not, for the pair-by-pair check to name it."""
    if MERGE_SPEEDUPS is not None:
        return MERGE_SPEEDUPS.bucket_counts(buckets, MAX_BUCKETS)
    try:
        if not set(map(type, buckets)) <= {list} or not set(map(len, buckets)) <= {2}:
            return None
        indices = [pair[0] for pair in buckets]
        counts = [pair[1] for pair in buckets]
    except TypeError:  # pragma: no cover - a list's len never fails
        return None
    if not set(map(type, indices)) <= {int} or not set(map(type, counts)) <= {int}:
        return None  # a bool, a float or a str among them
    if indices and not (indices[0] >= 0 and indices[-1] < MAX_BUCKETS and min(counts) > 0):
        return None
    if indices != sorted(set(indices)):  # strictly ascending
        return None
    return dict(zip(indices, counts, strict=True))


class LogHistogram:
    """A log-linear histogram of non-negative integers with 16 sub-buckets per power of two.

    Attributes:
        counts: ``{bucket index: count}`` (only non-empty buckets).
        count: number of samples.
        sum: exact sum of the samples.
        min: smallest sample (0 when empty).
        max: largest sample (0 when empty).
    """

    __slots__ = ("counts", "count", "sum", "min", "max")

    def __init__(self, values: Iterable[int] = ()) -> None:
        self.counts: dict[int, int] = {}
        self.count = 0
        self.sum = 0
        self.min = 0
        self.max = 0
        for v in values:
            self.add(v)

    def add(self, v: int) -> None:
        """Record one sample.

        Args:
            v: a non-negative integer (nanoseconds).

        Raises:
            TypeError: ``v`` is not an integer.
            ValueError: ``v`` is negative.
        """
        self.add_n(v, 1)

    def add_n(self, v: int, n: int) -> None:
        """Record ``n`` samples of the value ``v``.

        Args:
            v: a non-negative integer.
            n: how many samples, an integer >= 0.

        Raises:
            TypeError: ``v`` or ``n`` is not an integer.
            ValueError: ``v`` or ``n`` is negative.
        """
        if not _is_int(v):
            raise TypeError(f"value must be an int, got {v!r}")
        if not _is_int(n):
            raise TypeError(f"n must be an int, got {n!r}")
        if v < 0:
            raise ValueError(f"value must be >= 0, got {v!r}")
        if n < 0:
            raise ValueError(f"n must be >= 0, got {n!r}")
        if n == 0:
            return
        b = v.bit_length()
        if b <= _KEPT_BITS:
            i = v
        else:
            shift = b - _KEPT_BITS
            i = (shift << SUB_BITS) + (v >> shift)
        counts = self.counts
        counts[i] = counts.get(i, 0) + n
        if self.count == 0:
            self.min = self.max = v
        elif v < self.min:
            self.min = v
        elif v > self.max:
            self.max = v
        self.count += n
        self.sum += v * n

    def merge(self, other: LogHistogram) -> LogHistogram:
        """Add every sample of ``other`` to this histogram, in place; return ``self``.

        Raises:
            TypeError: ``other`` is not a :class:`LogHistogram`.
        """
        if not isinstance(other, LogHistogram):
            raise TypeError(f"can only merge a LogHistogram, got {type(other).__name__}")
        if other.count == 0:
            return self
        if MERGE_SPEEDUPS is not None:
            MERGE_SPEEDUPS.add_counts(self.counts, other.counts)
        else:
            counts = self.counts
            for i, c in other.counts.items():
                counts[i] = counts.get(i, 0) + c
        if self.count == 0:
            self.min, self.max = other.min, other.max
        else:
            self.min = min(self.min, other.min)
            self.max = max(self.max, other.max)
        self.count += other.count
        self.sum += other.sum
        return self

    def merged(self, *others: LogHistogram) -> LogHistogram:
        """Return a new histogram holding the samples of ``self`` and of every one of ``others``."""
        result = self.copy()
        for other in others:
            result.merge(other)
        return result

    def copy(self) -> LogHistogram:
        """Return an independent copy."""
        h = LogHistogram()
        h.counts = dict(self.counts)
        h.count, h.sum, h.min, h.max = self.count, self.sum, self.min, self.max
        return h

    def percentile(self, q: float) -> int:
        """Return the nearest-rank ``q`` quantile, within :data:`RELATIVE_ERROR` of the exact one.

        The ``ceil(q * count)``-th smallest sample's bucket midpoint, clamped to
        ``[min, max]``; an empty histogram gives 0. (:attr:`min` and :attr:`max` are the exact
        extremes.)

        Args:
            q: the quantile, a number in ``[0, 1]`` (0.95 for p95).

        Raises:
            ValueError: ``q`` is outside ``[0, 1]`` or NaN.
        """
        return self.percentiles((q,))[0]

    def percentiles(self, qs: Iterable[float]) -> list[int]:
        """Return :meth:`percentile` for each quantile of ``qs`` in one pass over the buckets.

        Raises:
            ValueError: a quantile is outside ``[0, 1]`` or NaN.
        """
        qs = list(qs)
        for q in qs:
            if not 0.0 <= q <= 1.0:
                raise ValueError(f"quantile must be in [0, 1], got {q!r}")
        n = self.count
        if n == 0:
            return [0 for _ in qs]
        keys = sorted(self.counts)
        cumulative = list(accumulate(map(self.counts.__getitem__, keys)))
        lo, hi = self.min, self.max
        out = []
        for q in qs:
            # The bucket holding the rank-th smallest sample, reported as its midpoint clamped
            # to [min, max] -- never "the exact max when rank == n": a percentile must depend
            # only on the buckets, min and max, so that merging a histogram with itself leaves
            # every percentile as it was.
            m = _midpoint(keys[bisect_left(cumulative, nearest_rank(q, n))])
            out.append(lo if m < lo else hi if m > hi else m)
        return out

    def to_json(self) -> dict[str, Any]:
        """Return the JSON form: ``{"sub_bits": 4, "buckets": [[index, count], ...], "count",
        "sum", "min", "max"}`` with the buckets sorted by index."""
        return {
            "sub_bits": SUB_BITS,
            "buckets": list(map(list, sorted(self.counts.items()))),
            "count": self.count,
            "sum": self.sum,
            "min": self.min,
            "max": self.max,
        }

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> LogHistogram:
        """Rebuild a histogram from :meth:`to_json`'s form, checking that it is consistent.

        Raises:
            ValueError: the object is not a valid histogram (one-line message saying why).
        """
        parts = (
            None
            if MERGE_SPEEDUPS is None
            else MERGE_SPEEDUPS.histogram_parts(obj, SUB_BITS, MAX_BUCKETS)
        )
        if parts is not None:  # every check below holds (in C); else they name what does not
            h = cls()
            h.counts, h.count, h.sum, h.min, h.max = parts
            return h
        if not isinstance(obj, Mapping):
            raise ValueError(f"histogram must be an object, got {type(obj).__name__}")
        missing = [k for k in ("sub_bits", "buckets", "count", "sum", "min", "max") if k not in obj]
        if missing:
            raise ValueError(f"histogram lacks {', '.join(missing)}")
        if obj["sub_bits"] != SUB_BITS or not _is_int(obj["sub_bits"]):
            raise ValueError(f"histogram sub_bits must be {SUB_BITS}, got {obj['sub_bits']!r}")
        for k in ("count", "sum", "min", "max"):
            if not _is_int(obj[k]) or obj[k] < 0:
                raise ValueError(f"histogram {k} must be an int >= 0, got {obj[k]!r}")
        buckets = obj["buckets"]
        if not isinstance(buckets, list):
            raise ValueError(f"histogram buckets must be a list, got {type(buckets).__name__}")
        fast = checked_buckets(buckets)
        counts: dict[int, int] = {} if fast is None else fast
        previous = -1
        for pair in buckets if fast is None else ():  # the slow path names the culprit
            if (
                not isinstance(pair, list)
                or len(pair) != 2
                or not _is_int(pair[0])
                or not _is_int(pair[1])
            ):
                raise ValueError(f"histogram bucket must be [index, count], got {pair!r}")
            i, c = pair
            if not previous < i < MAX_BUCKETS:
                raise ValueError(
                    f"histogram bucket indices must ascend within [0, {MAX_BUCKETS}), got {i!r}"
                )
            if c <= 0:
                raise ValueError(f"histogram bucket {i} count must be > 0, got {c!r}")
            counts[i] = c
            previous = i
        h = cls()
        h.counts = counts
        h.count, h.sum, h.min, h.max = obj["count"], obj["sum"], obj["min"], obj["max"]
        if sum(counts.values()) != h.count:
            raise ValueError(
                f"histogram count {h.count} differs from its buckets' total {sum(counts.values())}"
            )
        if h.count:
            first, last = min(counts), max(counts)
            if bucket_of(h.min) != first or bucket_of(h.max) != last:
                raise ValueError(f"histogram min {h.min} / max {h.max} fall outside its buckets")
            if not h.min * h.count <= h.sum <= h.max * h.count:
                raise ValueError(
                    f"histogram sum {h.sum} is impossible for {h.count} samples "
                    f"in [{h.min}, {h.max}]"
                )
        elif h.sum or h.min or h.max:
            raise ValueError("empty histogram must have sum, min and max 0")
        return h

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, LogHistogram):
            return NotImplemented
        return (
            self.count == other.count
            and self.sum == other.sum
            and self.min == other.min
            and self.max == other.max
            and self.counts == other.counts
        )

    __hash__ = None  # type: ignore[assignment]  # mutable

    def __repr__(self) -> str:
        if not self.count:
            return "<LogHistogram empty>"
        return (
            f"<LogHistogram count={self.count} min={self.min} "
            f"p50={self.percentile(0.5)} max={self.max}>"
        )


def from_buckets(
    counts: dict[int, int], total: int, lo: int, hi: int, zeros: int = 0
) -> LogHistogram:
    """A recorder's bucket dict (``bucket_of(ns) -> count``) as a ``LogHistogram``, with
    ``zeros`` extra samples of 0.

    Set field by field (the histogram's documented attributes), without ``from_json``'s
    consistency checks: a snapshot reads counters that other threads may be writing, and a total
    one sample ahead of its buckets is still a usable histogram. With no bucket yet and a total
    above 0, the owner (the pure-Python path's release, between its two writes) has added its
    first sample to the total only: that sample is the total, and it is counted, so the
    histogram's sum is the total the timeline sampled (an empty histogram's 0 made the data
    refused: "timeline ... adds up to more than the lock's hold_ns.sum", 1 SIGTERM trial in
    400 on that path).
    """
    h = LogHistogram()
    buckets = dict(counts)  # one C-level copy: the owner thread may be adding to it
    n = sum(buckets.values())
    if not n and total > 0:
        buckets, n, lo, hi = {bucket_of(total): 1}, 1, total, max(hi, total)
    if zeros > 0:
        buckets[0] = buckets.get(0, 0) + zeros
        n += zeros
        lo = 0
    if n:
        h.counts, h.count, h.sum, h.min, h.max = buckets, n, total, max(lo, 0), hi
    return h
