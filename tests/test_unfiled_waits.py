"""Waits counted on the lock path and filed off it (``record._waits``).

The waiter counts its wait on its ``Stats`` at once and leaves one tuple (``UNFILED_FIELDS``); the
emitter, a snapshot or a fold files its sites and its record. The tuple is the same whichever
path made it (the C path's ``lock_wait_here`` or the Python path's ``record_wait``: this file runs
on both legs); no wait is lost to a fold, a full queue or a filer re-entered on its own thread.
"""

from __future__ import annotations

import threading

from polling import until

from otel_lockwatch._session import RECORDER
from otel_lockwatch.manifest._data import normalize
from otel_lockwatch.record._data import merge_data
from otel_lockwatch.record._histogram import bucket_of
from otel_lockwatch.record._sites import (
    READS,
    UNKNOWN,
    SiteTable,
    read_points,
    site_points,
    with_unfiled,
)
from otel_lockwatch.record._state_parts import stats_data
from otel_lockwatch.record._stats import Stats
from otel_lockwatch.record._waits import UNFILED_FIELDS, UnfiledWaits


def _blocked_on(lock) -> bool:
    name = lock._lockwatch_class.name
    return any(waiting for (cls, _), (waiting, _) in RECORDER.live().items() if cls == name)


def _contended_once(lock, name: str = "waiter") -> threading.Thread:
    """One thread that waits for ``lock`` (held by the caller until it blocks), then takes it."""

    def wait() -> None:
        with lock:  # the site that waits
            pass

    thread = threading.Thread(target=wait, name=name)
    lock.acquire()  # the site that holds
    try:
        thread.start()
        until(lambda: _blocked_on(lock), "the waiter never blocked")
    finally:
        lock.release()
    thread.join()
    return thread


def test_a_wait_leaves_one_tuple_with_what_a_later_look_could_not_have(make_watched):
    make_watched(wait_span_threshold_ms=0)  # every wait a span: the tuple carries its parts
    lock = threading.Lock()
    with RECORDER.waits.lock:  # no filer takes it meanwhile (the emitter waits for this)
        thread = _contended_once(lock)
        unfiled = [w for w in RECORDER.waits.queue if w[1] is lock._lockwatch_class]
        assert len(unfiled) == 1
        wait = dict(zip(UNFILED_FIELDS, unfiled[0], strict=True))
    state = next(s for s in RECORDER.states if s.worker == "waiter")
    assert wait["stats"] is state.stats[lock._lockwatch_class]
    assert wait["stats"].contentions == 1  # counted at once
    assert wait["start_ns"] <= wait["end_ns"] and wait["ok"] is True
    code, offset = wait["waiter"]
    assert code.co_name == "wait" and isinstance(offset, int)
    holder_code, _ = wait["holder"]
    assert holder_code.co_name == "_contended_once"
    assert wait["site"] == (__name__, code, offset)
    who, ident = wait["thread"]
    assert ident == thread.ident and (who if isinstance(who, str) else who.name) == "waiter"
    RECORDER.waits.file()
    points = RECORDER.snapshot()["locks"][lock._lockwatch_class.name]["contention_points"]
    assert sum(point.count for point in points.values()) == 1


def test_no_site_is_lost_to_the_fold_of_ended_threads(make_watched):
    """Threads of one name that each wait once and end: their states are folded 64 at a time,
    and each fold files the waits first, into the states it folds."""
    make_watched()
    lock = threading.Lock()
    for _ in range(140):
        _contended_once(lock, name="request")
    entry = RECORDER.snapshot()["locks"][lock._lockwatch_class.name]
    assert entry["contentions"] == 140
    assert sum(point.count for point in entry["contention_points"].values()) == 140
    assert sum(point["count"] for point in entry["contending_points"].values()) == 140


def test_a_full_queue_files_the_waiters_own_wait_unless_a_filer_is_at_work():
    waits = UnfiledWaits()
    waits.LIMIT = 2
    queued: list[tuple] = []
    waits.queue_record = lambda *record: queued.append(record)
    stats = [_Stats() for _ in range(4)]
    for s in stats[:2]:
        waits.add(_wait(s))
    assert len(waits.queue) == 2 and not queued
    waits.add(_wait(stats[2]))  # full: filed here, at once
    assert len(waits.queue) == 2 and len(queued) == 1 and stats[2].sites is not None
    held = threading.Event()
    done = threading.Event()

    def filer() -> None:
        with waits.lock:
            held.set()
            done.wait(10)

    other = threading.Thread(target=filer)
    other.start()
    held.wait(10)
    waits.add(_wait(stats[3]))  # full, and another filer at work: queued all the same
    done.set()
    other.join()
    assert len(waits.queue) == 3 and stats[3].sites is None
    assert waits.file()
    assert not waits.queue and all(s.sites is not None for s in stats)
    assert len(queued) == 4


def test_a_filer_re_entered_on_its_own_thread_files_the_rest_itself():
    """A signal handler or a finalizer that snapshots while its thread files: it does not wait
    for itself, and every wait is filed once."""
    waits = UnfiledWaits()
    filed: list[int] = []

    def record(*args) -> None:
        filed.append(args[1])  # (the start: which wait)
        if len(filed) == 1:
            assert waits.file()  # re-entered, as a handler's snapshot would

    waits.queue_record = record
    stats = _Stats()
    for i in range(5):
        waits.add(_wait(stats, start=i))
    assert waits.file()
    assert sorted(filed) == list(range(5)) and not waits.queue
    assert sum(row[0] for row in stats.sites.waits.values()) == 5


def test_a_failure_while_filing_goes_to_failed_and_filing_goes_on():
    waits = UnfiledWaits()
    failures: list[BaseException] = []
    waits.failed = failures.append

    def record(*args) -> None:
        if args[1] == 1:
            raise ZeroDivisionError("lockwatch bug")

    waits.queue_record = record
    stats = _Stats()
    for i in range(3):
        waits.add(_wait(stats, start=i))
    assert waits.file()
    assert len(failures) == 1 and not waits.queue


class _Stats:
    sites = None


def _wait(stats, start: int = 0) -> tuple:
    return (stats, "cls", start, start + 10, True, None, None, 10**9, UNKNOWN, None, None, None)


def test_waits_counted_but_not_filed_when_a_snapshot_reads_are_charged_to_unknown():
    """A wait may end while a snapshot reads (it filed first): its counts are there, its sites
    not yet. The points still add up to the counters: the rest is ``(unknown)`` at both ends."""
    from otel_lockwatch.record._sites import SiteTable
    from otel_lockwatch.record._state_parts import stats_data
    from otel_lockwatch.record._stats import Stats

    s = Stats()
    s.sites = SiteTable()
    code = test_waits_counted_but_not_filed_when_a_snapshot_reads_are_charged_to_unknown.__code__
    s.sites.add((code, 0), (code, 2), 10)
    s.contentions, s.wait_total_ns, s.acquisitions = 3, 40, 3
    s.wait_histogram = {10: 1, 15: 2}
    data = stats_data("threading.Lock", "w", s)
    waits, holders = data["contention_points"], data["contending_points"]
    assert (sum(h.count for h in waits.values()), sum(h.sum for h in waits.values())) == (3, 40)
    assert (waits[UNKNOWN].count, waits[UNKNOWN].sum) == (2, 30)
    assert holders[UNKNOWN] == {"count": 2, "wait_ns": 30}
    s.contentions = s.wait_total_ns = 0
    s.sites = None  # no table and no wait: no points (a lock entry without them is whole)
    assert "contention_points" not in stats_data("threading.Lock", "w", s)


def test_a_first_wait_not_filed_yet_is_charged_so_that_the_workers_merge():
    """A worker's first wait on a lock, counted and not filed yet, has no table yet: it is
    charged to ``(unknown)`` all the same, so that the lock's entry, merged with another
    worker's that has points, adds up (it fell short of the lock's counters, and the evaluation
    refused the snapshot: 2 to 7 runs in 30 of the finalizer stress on 3.11's pure path)."""
    filed, unfiled = Stats(), Stats()
    filed.sites = SiteTable()
    filed.sites.add(_WAITER, _HOLDER, 3_000)
    for stats, waited in ((filed, 3_000), (unfiled, 5_000)):
        stats.contentions, stats.wait_total_ns, stats.acquisitions = 1, waited, 1
        stats.wait_histogram = {bucket_of(waited): 1}
    assert unfiled.sites is None
    data = merge_data(
        {"locks": {"shared": stats_data("threading.Lock", worker, stats)}}
        for worker, stats in (("a", filed), ("b", unfiled))
    )
    entry = data["locks"]["shared"]
    assert _adds_up(entry, 2, 8_000)
    assert (entry["contention_points"][UNKNOWN].count, entry["contention_points"][UNKNOWN].sum) == (
        1,
        5_000,
    )
    normalize(data)  # the evaluation's reading, which checks that: accepted


# -- a snapshot's read of a table a filer is writing --------------------------------------------


# A waiter's and a holder's site: (code, instruction offset), as the lock path takes them.
_WAITER = ((lambda: None).__code__, 2)
_HOLDER = ((lambda: None).__code__, 4)


class _TornOnce(Stats):
    """A worker's statistics whose table reads torn (as a filer's add, cut between a row's
    total and its buckets, leaves it) the first ``torn`` times, whole after that."""

    def __init__(self, torn: int) -> None:
        super().__init__()
        self.torn, self.whole = torn, SiteTable()
        self.whole.add(_WAITER, _HOLDER, 3_000)
        self.whole.add(_WAITER, _HOLDER, 5_000)
        self.contentions, self.wait_total_ns = 2, 8_000

    @property  # type: ignore[override]
    def sites(self) -> SiteTable:
        if self.torn == 0:
            return self.whole
        self.torn -= 1
        table = SiteTable()
        table.add(_WAITER, _HOLDER, 3_000)
        table.add(_WAITER, _HOLDER, 5_000)
        table.waits[_WAITER][1] -= 5_000  # the second add's time not in the total yet
        return table

    @sites.setter
    def sites(self, value: object) -> None:  # Stats() sets it
        pass


def _adds_up(points: dict, contentions: int, wait_total: int) -> bool:
    waits, holders = points["contention_points"], points["contending_points"]
    return (
        (sum(h.count for h in waits.values()), sum(h.sum for h in waits.values()))
        == (sum(r["count"] for r in holders.values()), sum(r["wait_ns"] for r in holders.values()))
        == (contentions, wait_total)
    )


def test_a_torn_read_of_a_table_is_read_again():
    """A read of the table in the middle of a filer's add is made again: the points are the
    whole read's (the waits at their sites), and they add up to the counters."""
    stats = _TornOnce(torn=1)
    points, contentions, wait_total = read_points(stats)
    assert (contentions, wait_total) == (2, 8_000)
    assert stats.torn == 0  # read twice
    assert set(points["contention_points"]) == set(site_points(stats.whole)["contention_points"])
    assert UNKNOWN not in points["contention_points"]
    assert _adds_up(with_unfiled(points, contentions, wait_total), contentions, wait_total)


def test_a_table_torn_at_every_read_gives_its_counters_to_unknown():
    """Torn at every read: the counters stand, charged to ``(unknown)`` at both ends, and the
    recording loads back (a snapshot's own data never refused)."""
    stats = _TornOnce(torn=READS)
    points, contentions, wait_total = read_points(stats)
    assert (contentions, wait_total) == (2, 8_000)
    assert set(points["contention_points"]) == {UNKNOWN}
    assert set(points["contending_points"]) == {UNKNOWN}
    assert _adds_up(points, contentions, wait_total)
    data = {"locks": {"shared": stats_data("lock", "w", stats)}}
    assert _adds_up(data["locks"]["shared"], 2, 8_000)
