"""The measured sizing (``manifest/_sizing.py``, docs/sizing.md): which threads are the pool's
workers, what each bottleneck supports, and a recommended size that keeps the throughput and is
a fixed point.

The reference for the property test is ``_snapshots.PoolRun``: a pool of ``c`` slots simulated
event by event, whose throughput at every worker count is known exactly, so the knee (the
fewest workers reaching 90 % of the best throughput) is computed rather than assumed.
"""

from __future__ import annotations

import math

from _snapshots import PoolRun, locks_and_workers, pool_data
from hypothesis import given, settings
from hypothesis import strategies as st

from otel_lockwatch import evaluate
from otel_lockwatch.cli._report_html import render_html
from otel_lockwatch.cli._report_text import render_text
from otel_lockwatch.manifest._data import normalize
from otel_lockwatch.manifest._sizing import SIZING_MIN_SAMPLES, pool_workers

MS = 1_000_000
NOMINAL = 16
TASKS = 40


def _throughput(workers: int, capacity: int, hold_ns: int, think_ns: int) -> float:
    run = PoolRun(workers, capacity, tasks=TASKS, hold_ns=hold_ns, think_ns=think_ns)
    return workers * TASKS / max(run.observed.values())


def _recommended(workers: int, capacity: int, hold_ns: int, think_ns: int, kind: str) -> int:
    run = PoolRun(workers, capacity, tasks=TASKS, hold_ns=hold_ns, think_ns=think_ns)
    return evaluate(pool_data(run, kind), pool_size=workers).recommended_pool_size


@settings(max_examples=40)
@given(
    capacity=st.integers(1, 4),
    hold_ms=st.integers(1, 10),
    think_ms=st.integers(0, 20),
    kind=st.sampled_from(["semaphore", "condition", "lifo_queue"]),
)
def test_following_the_recommendation_keeps_the_throughput_and_is_a_fixed_point(
    capacity, hold_ms, think_ms, kind
):
    """Issue #25's criteria on simulated pools of every shape: the size recommended by a run
    at 16 keeps 90 % of its throughput, is at most max(knee + 1, 1.5 knee), and a run at that
    size recommends the same size (no spiral: 16 -> 12 -> 9 -> 6 with the old fractions); for a
    pool of unknown capacity, at least the knee, and the same size from then on."""
    hold, think = hold_ms * MS, think_ms * MS
    xput = {n: _throughput(n, capacity, hold, think) for n in range(1, NOMINAL + 1)}
    best = max(xput.values())
    knee = min(n for n, x in xput.items() if x >= 0.9 * best)
    r = _recommended(NOMINAL, capacity, hold, think, kind)
    assert xput[r] >= 0.9 * xput[NOMINAL]
    assert r <= max(knee + 1, math.floor(1.5 * knee))
    again = _recommended(r, capacity, hold, think, kind)
    if kind == "condition":
        # A bare condition knows no capacity: it is sized by the workers it let work, which a
        # run of fewer workers measures with less slack. It converges, at or above the knee.
        assert knee <= again <= r
        assert _recommended(again, capacity, hold, think, kind) == again
    else:
        assert again == r  # Little's law: u does not change with the number of workers


def test_the_old_fractions_spiral_and_the_model_does_not():
    """The issue's first workload in miniature: a pool of 2 slots, 5 ms held of every 10 ms.
    Its knee is 4; the recommendation is 5 from 16, from 5 and from 4."""
    hold, think = 5 * MS, 5 * MS
    assert [_recommended(n, 2, hold, think, "semaphore") for n in (16, 5, 4)] == [5, 5, 4]


def test_threads_that_share_no_lock_with_the_pool_are_reported_apart():
    """Four workers on one lock, a scheduler thread and a maintenance thread each on a lock of
    their own: the two are apart, and their idle time does not dilute the throughput."""
    events = [(f"w{i}", "db", 30 * MS, 10 * MS) for i in range(4) for _ in range(25)]
    events += [("scheduler", "timer", 0, MS), ("reaper", "reap", 0, MS)]
    locks, workers = locks_and_workers(events, idle_ns=0)
    workers["scheduler"]["observed_ns"] = 60_000 * MS  # idle by design, all run long
    workers["reaper"]["observed_ns"] = 60_000 * MS
    data = {"locks": locks, "workers": workers}
    pool, apart = pool_workers(normalize(data))
    assert (pool, apart) == ({"w0", "w1", "w2", "w3"}, ["reaper", "scheduler"])
    m = evaluate(data, pool_size=4).to_dict()
    assert m["other_threads"] == {"count": 2, "observed_ms": 120_000.0, "names": apart}
    assert m["effective_throughput_pct"] == 25.0  # 30 ms waited of every 40
    assert m["verdict"] == "HOT_LOCK_DETECTED"
    assert m["sizing"]["workers"] == 4


def test_when_nobody_shares_a_lock_every_thread_is_a_worker():
    events = [(f"w{i}", f"own-{i}", 0, MS) for i in range(3)]
    locks, workers = locks_and_workers(events)
    assert pool_workers(normalize({"locks": locks, "workers": workers})) == ({"w0", "w1", "w2"}, [])


def test_a_bottleneck_seen_too_few_times_falls_back_to_the_verdict():
    """Material waits on a lock taken only 10 times: too little to size, so the verdict's
    fraction applies (three quarters for a hot lock), and the manifest says so."""
    events = [(f"w{i}", "l", 20 * MS, MS) for i in range(5) for _ in range(2)]
    locks, workers = locks_and_workers(events)
    m = evaluate({"locks": locks, "workers": workers}, pool_size=8)
    assert m.verdict == "HOT_LOCK_DETECTED"
    assert m.sizing["basis"] == "verdict"
    assert m.sizing["reason"] == (
        f"too few samples to size (at least {SIZING_MIN_SAMPLES} needed): l (10)"
    )
    assert m.recommended_pool_size == 6


def test_little_s_law_on_a_mutex_held_a_third_of_the_time():
    """Four workers each 2 ms of work and 1 ms inside one lock (observed 3 ms per task, 1 ms of
    which waiting at 4 workers): u = 1 / 3, the lock supports 3 workers, 3.3 -> 4 recommended."""
    events = []
    for i in range(4):
        for _ in range(30):
            events.append((f"w{i}", "mutex", MS, MS))
    locks, workers = locks_and_workers(events, idle_ns=0)
    for w in workers.values():  # plus 2 ms of work per task outside any lock
        w["observed_ns"] += 30 * 2 * MS
    m = evaluate({"locks": locks, "workers": workers}, pool_size=4)
    [b] = m.sizing["bottlenecks"]
    assert (b["method"], b["capacity"], b["capacity_source"]) == ("littles_law", 1, "mutex")
    assert b["utilization_per_worker"] == round(1 / 3, 6)
    assert b["workers_supported"] == 3.0
    assert m.recommended_pool_size == 4
    curve = dict(m.sizing["predicted_throughput_pct"])
    assert curve == {1: 33.333, 2: 66.667, 3: 100.0, 4: 100.0}


def test_the_reports_show_the_derivation_and_the_curve():
    run = PoolRun(NOMINAL, 2, tasks=TASKS, hold_ns=5 * MS, think_ns=5 * MS)
    doc = evaluate(pool_data(run, "semaphore"), pool_size=NOMINAL).to_dict()
    text = render_text(doc, width=200)
    assert "sizing (measured: docs/sizing.md)" in text
    assert "  recommended 5: 4 workers x 1.1, rounded up" in text
    assert (
        "  app.db:make_pool:12 (threading.BoundedSemaphore): supports 4 workers by Little's "
        "law (held 50 % of a worker's busy time, capacity 2)"
    ) in text
    assert "      5 ████████████████████████ 100.0 %  <- recommended" in text
    page = render_html(doc)
    assert page.count('id="sizing-chart"') == 1
    assert page.count('class="point"') == NOMINAL
    assert 'id="sizing-recommended"' in page and "recommended 5</text>" in page


def test_groups_of_comparable_size_are_all_workers():
    """Two children of a merged fleet on one lock beside three parent threads on another: both
    groups are workers (neither is half the other's size); a lone thread is apart."""
    events = [(f"child-{i}", "shared", 5 * MS, MS) for i in range(2) for _ in range(25)]
    events += [(f"parent-{i}", "feeder", 0, MS) for i in range(3) for _ in range(25)]
    events += [("reaper", "reap", 0, MS)]
    locks, workers = locks_and_workers(events)
    pool, apart = pool_workers(normalize({"locks": locks, "workers": workers}))
    assert pool == {"child-0", "child-1", "parent-0", "parent-1", "parent-2"}
    assert apart == ["reaper"]
