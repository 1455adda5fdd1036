"""Tests of the manifest: evaluation on snapshots with known ground truth, thresholds, file
format (atomic dump, load, edited manifests refused), the admission check and
``recommended_workers``."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import statistics

import pytest
from _snapshots import locks_and_workers
from hypothesis import given, settings
from hypothesis import strategies as st

from otel_lockwatch import _settings
from otel_lockwatch.exceptions import ManifestError
from otel_lockwatch.manifest import _io
from otel_lockwatch.manifest._admission import may_spawn_pool_size, recommended_workers
from otel_lockwatch.manifest._evaluate import evaluate, recommended_section_count
from otel_lockwatch.manifest._io import dump_manifest, load_manifest
from otel_lockwatch.manifest._model import (
    SCHEMA,
    Manifest,
    Verdict,
    canonical_json,
    compute_digest,
)
from otel_lockwatch.record._histogram import RELATIVE_ERROR, LogHistogram

MS = 1_000_000


def snapshot(events, *, idle_ns=0, pool=None, cycle_edges=(), sections=None, pid=4242):
    """A recorder snapshot built from raw acquisitions ``(worker, lock, wait_ns, hold_ns)``.

    Each worker's observed time is the sum of its waits and holds plus ``idle_ns``.
    ``cycle_edges`` are ``(holding, acquiring, worker)`` lock-order edges.
    """
    locks, workers = locks_and_workers(events, idle_ns)
    edges = [
        {
            "holding": a,
            "acquiring": b,
            "worker": w,
            "sites": [f"app.py:f:{i}", f"app.py:g:{i}"],
            "at": f"2026-10-26T12:00:0{i}.000Z",
            "trace_id": None,
            "span_id": None,
        }
        for i, (a, b, w) in enumerate(cycle_edges)
    ]
    cycles = []
    if edges:
        from otel_lockwatch.record._cycles import merge_order_data

        cycles = merge_order_data([{"edges": edges, "cycles": []}])["cycles"]
    return {
        "locks": locks,
        "workers": workers,
        "lock_order": {"edges": edges, "cycles": cycles},
        "blocking_under_lock": {},
        "sections": sections or {},
        "pool": pool or {"nominal": None, "source": None},
        "process": {
            "pid": pid,
            "service.name": "svc",
            "start": "2026-10-26T12:00:00.000Z",
            "end": "2026-10-26T12:01:00.000Z",
        },
    }


EXECUTOR_8 = {"nominal": 8, "source": "executor"}


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    for setting in _settings.SETTINGS.values():
        monkeypatch.delenv(setting.variable, raising=False)
    _settings.WARNED.clear()


def hot_pool_events():
    """8 workers hammer ``global_config`` (hold 2 ms each, waits 3..10 ms, evenly spread); each
    also takes its own partition lock freely."""
    events = []
    for i in range(8):
        for k in range(10):
            events.append((f"w{i}", "global_config", (3 + (i + k) % 8) * MS, 2 * MS))
            events.append((f"w{i}", f"partition_{i}", 0, 100_000))
    return events


# ---------------------------------------------------------------------------------------------
# Scenarios with known ground truth


def test_hot_lock_scenario():
    """A global lock hammered by 8 workers is HOT_LOCK_DETECTED, first in the register, with
    hold percentiles matching the imposed hold, and the pool shrinks to what the lock supports.

    The workers work only while they hold a lock (their observed time is their waits and
    holds), so the run kept 8 x 168 / 688 = 1.95 workers busy. The lock was held 160 ms in a
    run of 688 / 8 = 86 ms: more than one lock of the class was held at once, its capacity is
    unknown, and it supports what the run kept busy; 1.95 x 1.1 rounds up to 3."""
    m = evaluate(snapshot(hot_pool_events(), pool=EXECUTOR_8))
    assert m.verdict is Verdict.HOT_LOCK_DETECTED
    assert m.verdict == "HOT_LOCK_DETECTED"
    total_wait = sum(w for _, lock, w, _ in hot_pool_events() if lock == "global_config")
    assert m.hot_lock_register == [
        {"lock": "global_config", "wait_ms": total_wait / MS, "wait_share_pct": 100.0}
    ]
    dist = m.hold_time_distribution["global_config"]
    assert dist["count"] == 80
    assert dist["max_ms"] == 2.0
    for key in ("p50_ms", "p95_ms"):
        assert abs(dist[key] - 2.0) <= 2.0 * RELATIVE_ERROR
    assert m.starvation_signatures == []
    assert (m.nominal_pool_size, m.pool_size_source, m.recommended_pool_size) == (8, "executor", 3)
    busy = 80 * 2 * MS + 80 * 100_000  # every hold: global_config's and the partitions'
    observed = busy + total_wait
    [bottleneck] = m.sizing["bottlenecks"]
    assert bottleneck["name"] == "global_config"
    assert (bottleneck["method"], bottleneck["capacity_source"]) == (
        "saturation",
        "several instances",
    )
    assert bottleneck["workers_supported"] == round(8 * busy / observed, 3)
    assert m.sizing["basis"] == "measured"
    assert m.locks["global_config"]["acquisitions"] == 80
    assert m.locks["global_config"]["contentions"] == 80
    assert m.locks["partition_3"]["contentions"] == 0


def test_hot_lock_register_is_sorted_by_wait_and_respects_the_threshold():
    """Locks at 60 %, 28 % and 12 % of the wait: the first two are hot, in that order; with a
    threshold of 5 % the third too (its wait is 12 / 103 of the workers' time: material)."""
    events = [("w0", "a", 60 * MS, MS), ("w1", "b", 28 * MS, MS), ("w2", "c", 12 * MS, MS)]
    m = evaluate(snapshot(events))
    assert [(h["lock"], h["wait_share_pct"]) for h in m.hot_lock_register] == [
        ("a", 60.0),
        ("b", 28.0),
    ]
    assert sorted(m.hold_time_distribution) == ["a", "b"]
    assert evaluate(snapshot(events), hot_lock_threshold_pct=5).hot_lock_register[2]["lock"] == "c"


def test_a_lock_is_hot_only_when_its_wait_is_material():
    """A lock with all of a tiny aggregate wait is not hot: 16 workers that waited 5 % of their
    time (a well-sized pool) are LOW_CONTENTION; at 10 % of their time the lock is hot."""
    work = 95 * MS
    events = [(f"w{i:02d}", "pool", 5 * MS, MS) for i in range(16)]
    m = evaluate(snapshot(events, idle_ns=work - MS))
    assert m.verdict is Verdict.LOW_CONTENTION
    assert m.hot_lock_register == []
    assert m.effective_throughput_pct == 95.0
    events = [(f"w{i:02d}", "pool", 10 * MS, MS) for i in range(16)]
    m = evaluate(snapshot(events, idle_ns=90 * MS - MS))
    assert m.verdict is Verdict.HOT_LOCK_DETECTED
    assert m.effective_throughput_pct == 90.0


def test_hot_lock_ties_are_ordered_by_name():
    events = [("w0", "zeta", 5 * MS, MS), ("w1", "alpha", 5 * MS, MS)]
    m = evaluate(snapshot(events))
    assert [h["lock"] for h in m.hot_lock_register] == ["alpha", "zeta"]


def test_starvation_scenario():
    """One worker starved on a lock the seven others take freely: STARVATION_OBSERVED naming
    that worker and lock, the median 0 replaced by the floor. The workers do nothing but hold
    the lock (u = 1): it supports one worker, and 1.04 busy x 1.1 rounds up to 2."""
    events = [(f"w{i}", "shared", 0, 50_000) for i in range(7) for _ in range(20)]
    events += [("w7", "shared", 5 * MS, 50_000) for _ in range(10)]
    m = evaluate(snapshot(events, pool=EXECUTOR_8))
    assert m.verdict is Verdict.STARVATION_OBSERVED
    assert m.starvation_signatures == [
        {"worker": "w7", "lock": "shared", "wait_ms": 50.0, "median_wait_ms": 0.0}
    ]
    assert m.recommended_pool_size == 2
    assert m.sizing["bottlenecks"][0]["utilization_per_worker"] == 1.0


def test_starvation_against_a_nonzero_median():
    """Ratio 5 against the lower median of the per-worker waits: 6 ms over a 1 ms median is
    starvation, 4 ms is not."""
    base = [(f"w{i}", "l", MS, 0) for i in range(7)]
    assert evaluate(snapshot(base + [("w7", "l", 4 * MS, 0)])).starvation_signatures == []
    m = evaluate(snapshot(base + [("w7", "l", 6 * MS, 0)]))
    assert m.starvation_signatures == [
        {"worker": "w7", "lock": "l", "wait_ms": 6.0, "median_wait_ms": 1.0}
    ]
    assert evaluate(snapshot(base + [("w7", "l", 6 * MS, 0)]), starvation_ratio=7).verdict != (
        Verdict.STARVATION_OBSERVED
    )


def test_lower_median_sees_one_starved_worker_beside_one_idle_one():
    """With two workers the lower median is the smaller wait, so a lone starved worker shows."""
    m = evaluate(snapshot([("a", "l", 0, 0), ("b", "l", 10 * MS, 0)]))
    assert [s["worker"] for s in m.starvation_signatures] == ["b"]


def test_a_single_worker_never_starves():
    m = evaluate(snapshot([("a", "l", 100 * MS, 0)]))
    assert m.starvation_signatures == []


def test_small_waits_are_not_starvation():
    """A lone 50 us wait (the median being 0) is below the floors: no signature."""
    events = [(f"w{i}", "l", 0, 0) for i in range(7)] + [("w7", "l", 50_000, 0)]
    m = evaluate(snapshot(events))
    assert m.starvation_signatures == []
    # 0.9 ms is still under the 1 ms minimum wait even with a low ratio
    events[-1] = ("w7", "l", 900_000, 0)
    assert evaluate(snapshot(events), starvation_ratio=1.5).starvation_signatures == []


def test_cycle_scenario():
    """An A->B / B->A precursor that never deadlocked: CYCLIC_ORDERING_DETECTED with the witness,
    even though nothing waited. Nothing waited, so no lock limits the pool: a smaller pool
    would not take the locks in another order, and the size stays."""
    data = snapshot(
        [("t1", "A", 0, MS), ("t1", "B", 0, MS), ("t2", "A", 0, MS), ("t2", "B", 0, MS)],
        cycle_edges=[("A", "B", "t1"), ("B", "A", "t2")],
        pool=EXECUTOR_8,
    )
    m = evaluate(data)
    assert m.verdict is Verdict.CYCLIC_ORDERING_DETECTED
    assert m.recommended_pool_size == 8
    assert (m.sizing["basis"], m.sizing["bottlenecks"]) == ("measured", [])
    [cycle] = m.pre_deadlock_ordering_witness
    assert cycle["cycle"] == ["A", "B"]
    assert [(e["holding"], e["acquiring"], e["worker"]) for e in cycle["edges"]] == [
        ("A", "B", "t1"),
        ("B", "A", "t2"),
    ]
    assert m.lock_order == data["lock_order"]


def test_low_contention_scenario_keeps_the_nominal_size():
    """A well-partitioned pool: LOW_CONTENTION, nothing flagged, nominal size kept."""
    events = [(f"w{i}", f"partition_{i}", 0, MS) for i in range(8) for _ in range(50)]
    m = evaluate(snapshot(events, pool=EXECUTOR_8))
    assert m.verdict is Verdict.LOW_CONTENTION
    assert (m.hot_lock_register, m.starvation_signatures, m.pre_deadlock_ordering_witness) == (
        [],
        [],
        [],
    )
    assert m.recommended_pool_size == m.nominal_pool_size == 8
    assert m.effective_throughput_pct == 100.0


def test_verdict_precedence():
    """cycle > starvation > hot lock > low."""
    starving = [(f"w{i}", "shared", 0, 0) for i in range(7)] + [("w7", "shared", 50 * MS, 0)]
    m = evaluate(snapshot(starving))
    assert m.hot_lock_register and m.starvation_signatures
    assert m.verdict is Verdict.STARVATION_OBSERVED
    both = snapshot(starving, cycle_edges=[("A", "B", "t1"), ("B", "A", "t2")])
    assert evaluate(both).verdict is Verdict.CYCLIC_ORDERING_DETECTED
    assert evaluate(snapshot([])).verdict is Verdict.LOW_CONTENTION


def test_floors_make_no_lock_hot():
    """A 0.5 ms total wait is below the 1 ms floor; 2 ms over 10 s of worker time is below the
    1 %-of-observed floor. Neither is hot, though each is 100 % of the wait."""
    m = evaluate(snapshot([("a", "l", 500_000, 0), ("b", "l", 0, 0)]))
    assert m.hot_lock_register == [] and m.verdict is Verdict.LOW_CONTENTION
    m = evaluate(snapshot([("a", "l", 2 * MS, 0), ("b", "l", 0, 0)], idle_ns=5 * 10**9))
    assert m.hot_lock_register == []
    m = evaluate(snapshot([("a", "l", 2 * MS, 0), ("b", "l", 0, 0)]))
    assert m.hot_lock_register[0]["lock"] == "l"


def test_effective_throughput():
    """Workers observed 100 ms each, having waited 25 ms in all out of 200: 87.5 %."""
    data = snapshot([("a", "l", 20 * MS, 30 * MS), ("b", "l", 5 * MS, 45 * MS)], idle_ns=50 * MS)
    assert evaluate(data).effective_throughput_pct == 87.5
    assert evaluate(snapshot([])).effective_throughput_pct == 100.0


def test_nominal_pool_size_sources(monkeypatch):
    """Executor (data) first, then the argument, then the environment, then the workers seen."""
    events = [("a", "l", 0, 0), ("b", "l", 0, 0), ("c", "l", 0, 0)]
    assert evaluate(snapshot(events)).nominal_pool_size == 3
    assert evaluate(snapshot(events)).pool_size_source == "observed"
    assert evaluate(snapshot([])).nominal_pool_size == 1
    monkeypatch.setenv("OTEL_PYTHON_LOCKWATCH_POOL_SIZE", "12")
    m = evaluate(snapshot(events))
    assert (m.nominal_pool_size, m.pool_size_source) == (12, "env")
    m = evaluate(snapshot(events), pool_size=6)
    assert (m.nominal_pool_size, m.pool_size_source) == (6, "argument")
    m = evaluate(snapshot(events, pool=EXECUTOR_8), pool_size=6)
    assert (m.nominal_pool_size, m.pool_size_source) == (8, "executor")


def test_bad_pool_size_env_is_warned_once_and_ignored(monkeypatch, caplog):
    """The same message as instrument()'s for the same variable, logged once however often the
    manifest is evaluated."""
    monkeypatch.setenv("OTEL_PYTHON_LOCKWATCH_POOL_SIZE", "lots")
    with caplog.at_level(logging.WARNING, logger="otel_lockwatch"):
        m = evaluate(snapshot([("a", "l", 0, 0)]))
        evaluate(snapshot([("a", "l", 0, 0)]))
    assert m.pool_size_source == "observed"
    assert [r.getMessage() for r in caplog.records] == [
        "otel-lockwatch: OTEL_PYTHON_LOCKWATCH_POOL_SIZE must be an integer in [1, 1048576], "
        "got 'lots'; using the default None"
    ]


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"pool_size": 0}, ValueError, r"^pool_size must be an integer in \[1, 1048576\], got 0$"),
        (
            {"pool_size": 2.5},
            ValueError,
            r"^pool_size must be an integer in \[1, 1048576\], got 2\.5$",
        ),
        (
            {"pool_size": True},
            ValueError,
            r"^pool_size must be an integer in \[1, 1048576\], got True$",
        ),
        (
            {"hot_lock_threshold_pct": 0},
            ValueError,
            r"^hot_lock_threshold_pct must be a percentage in \(0, 100\], got 0$",
        ),
        (
            {"hot_lock_threshold_pct": 150},
            ValueError,
            r"^hot_lock_threshold_pct must be a percentage in \(0, 100\], got 150$",
        ),
        (
            {"hot_lock_threshold_pct": float("nan")},
            ValueError,
            r"^hot_lock_threshold_pct must be a percentage in \(0, 100\], got nan$",
        ),
        (
            {"hot_lock_threshold_pct": "lots"},
            ValueError,
            r"^hot_lock_threshold_pct must be a percentage in \(0, 100\], got 'lots'$",
        ),
        (
            {"starvation_ratio": float("inf")},
            ValueError,
            r"^starvation_ratio must be a number > 1, got inf$",
        ),
        ({"starvation_ratio": 1}, ValueError, r"^starvation_ratio must be a number > 1, got 1$"),
        (
            {"starvation_ratio": True},
            ValueError,
            r"^starvation_ratio must be a number > 1, got True$",
        ),
    ],
)
def test_nonsense_arguments_are_refused(kwargs, error, message):
    """The messages of instrument() for the same options."""
    with pytest.raises(error, match=message):
        evaluate(snapshot([("a", "l", 0, 0)]), **kwargs)


def test_arguments_are_read_as_instrument_reads_them():
    """Text and whole floats are accepted where instrument() accepts them."""
    m = evaluate(snapshot([("a", "l", 0, 0)]), hot_lock_threshold_pct="35", pool_size=6.0)
    assert m.thresholds["hot_lock_threshold_pct"] == 35.0
    assert (m.nominal_pool_size, m.pool_size_source) == (6, "argument")


def test_thresholds_from_env_and_arguments(monkeypatch, caplog):
    monkeypatch.setenv("OTEL_PYTHON_LOCKWATCH_HOT_LOCK_THRESHOLD_PCT", "35")
    monkeypatch.setenv("OTEL_PYTHON_LOCKWATCH_STARVATION_RATIO", "nonsense")
    with caplog.at_level(logging.WARNING, logger="otel_lockwatch"):
        t = evaluate(snapshot([])).thresholds
    assert (t["hot_lock_threshold_pct"], t["starvation_ratio"]) == (35.0, 5.0)
    assert [r.getMessage() for r in caplog.records] == [
        "otel-lockwatch: OTEL_PYTHON_LOCKWATCH_STARVATION_RATIO must be a number > 1, "
        "got 'nonsense'; using the default 5.0"
    ]
    t = evaluate(snapshot([]), hot_lock_threshold_pct=50, starvation_ratio=3).thresholds
    assert (t["hot_lock_threshold_pct"], t["starvation_ratio"]) == (50.0, 3.0)
    monkeypatch.setenv("OTEL_PYTHON_LOCKWATCH_HOT_LOCK_THRESHOLD_PCT", "0")
    assert evaluate(snapshot([])).thresholds["hot_lock_threshold_pct"] == 20.0


def test_thresholds_list_every_floor():
    assert evaluate(snapshot([])).thresholds == {
        "hot_lock_threshold_pct": 20.0,
        "hot_lock_min_wait_ms": 1.0,
        "hot_lock_min_cost_pct": 10.0,
        "starvation_ratio": 5.0,
        "starvation_median_floor_ms": 0.2,
        "starvation_min_wait_ms": 1.0,
        "starvation_min_wait_pct_of_observed": 5.0,
        "section_collision_target": 0.05,
        "histogram_relative_error": 0.03125,
    }


@pytest.mark.parametrize(
    ("max_held", "expected"), [(0, 1), (1, 1), (2, 32), (8, 1024), (16, 4096), (64, 65536)]
)
def test_recommended_section_count(max_held, expected):
    """The smallest power of two n with C(k, 2) / n <= 0.05."""
    assert recommended_section_count(max_held) == expected
    pairs = max_held * (max_held - 1) // 2
    assert pairs / expected <= 0.05
    if expected > 1:
        assert pairs / (expected // 2) > 0.05


def test_sections_are_sized():
    data = snapshot([], sections={"emitter": {"count": 16, "collision_waits": 3, "max_held": 8}})
    assert evaluate(data).sections == {
        "emitter": {
            "count": 16,
            "collision_waits": 3,
            "max_held": 8,
            "expected_colliding_pairs": 1.75,
            "recommended_count": 1024,
        }
    }


def test_locks_carry_totals_percentiles_and_mergeable_data():
    events = [("a", "l", w * MS, 2 * MS) for w in range(1, 11)]
    entry = evaluate(snapshot(events)).locks["l"]
    assert entry["wait_ms_total"] == 55.0 and entry["hold_ms_total"] == 20.0
    assert entry["wait"]["max_ms"] == 10.0
    assert abs(entry["wait"]["p50_ms"] - 5.0) <= 5.0 * RELATIVE_ERROR
    assert LogHistogram.from_json(entry["wait_ns"]) == LogHistogram(w * MS for w in range(1, 11))
    assert entry["workers"] == {
        "a": {"acquisitions": 10, "contentions": 10, "wait_ns": 55 * MS, "hold_ns": 20 * MS}
    }


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d.update(locks=[]), r"^locks must be an object, got list$"),
        (
            lambda d: d["locks"]["l"].update(acquisitions=-1),
            r"^locks\['l'\]\.acquisitions must be an int >= 0, got -1$",
        ),
        (
            lambda d: d["locks"]["l"]["workers"]["a"].update(wait_ns=1.5),
            r"^locks\['l'\]\.workers\['a'\]\.wait_ns must be an int >= 0, got 1\.5$",
        ),
        (
            lambda d: d["locks"]["l"]["workers"]["a"].pop("hold_ns"),
            r"^locks\['l'\]\.workers\['a'\] must be an object with "
            r"acquisitions, contentions, wait_ns, hold_ns$",
        ),
        (
            lambda d: d["locks"]["l"].update(wait_ns={"sub_bits": 4}),
            r"^locks\['l'\]\.wait_ns: histogram lacks buckets, count, sum, min, max$",
        ),
        (
            lambda d: d["workers"]["a"].update(observed_ns="x"),
            r"^workers\['a'\]\.observed_ns must be an int >= 0, got 'x'$",
        ),
        (
            lambda d: d.update(pool={"nominal": 0, "source": "executor"}),
            r"^pool\.nominal must be an int >= 1 or null, got 0$",
        ),
    ],
)
def test_malformed_data_is_refused_naming_the_field(mutate, message):
    data = snapshot([("a", "l", 0, 0)])
    mutate(data)
    with pytest.raises(ValueError, match=message):
        evaluate(data)


def test_evaluate_does_not_alias_its_input():
    """The manifest is independent of the snapshot it came from, and read-only."""
    data = snapshot([("a", "l", 5 * MS, 0), ("b", "l", 0, 0)])
    m = evaluate(data)
    digest = m.manifest_digest
    data["locks"]["l"]["workers"]["a"]["wait_ns"] = 0
    data["locks"]["l"]["wait_ns"].add(10**9)
    m.locks["l"]["acquisitions"] = 99
    assert compute_fresh_digest(m) == digest
    with pytest.raises(AttributeError, match=r"^Manifest is read-only; cannot set 'verdict'$"):
        m.verdict = "LOW_CONTENTION"
    with pytest.raises(TypeError):
        Manifest()


def compute_fresh_digest(m: Manifest) -> str:
    doc = json.loads(m.to_json())
    del doc["manifest_digest"]
    return hashlib.sha256(canonical_json(doc)).hexdigest()


def test_digest_is_sha256_of_the_canonical_json_of_everything_else():
    m = evaluate(snapshot(hot_pool_events()))
    doc = m.to_dict()
    digest = doc.pop("manifest_digest")
    text = json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    assert digest == hashlib.sha256(text.encode("utf-8")).hexdigest() == m.manifest_digest
    assert doc["schema"] == SCHEMA


def test_to_json_is_sorted_indented_with_trailing_newline():
    text = evaluate(snapshot([])).to_json()
    assert text.endswith("}\n")
    doc = json.loads(text)
    assert text == json.dumps(doc, sort_keys=True, indent=2, ensure_ascii=False) + "\n"


def test_re_evaluating_a_manifest_reproduces_it():
    """evaluate() accepts a manifest's JSON form (histograms as objects) and its data part."""
    m = evaluate(snapshot(hot_pool_events(), pool=EXECUTOR_8))
    assert evaluate(m.to_dict()) == m
    assert evaluate(json.loads(m.to_json())) == m
    assert evaluate(m.data) == m
    assert evaluate(m.data, hot_lock_threshold_pct=100.0).verdict is Verdict.HOT_LOCK_DETECTED


def test_unicode_names_survive():
    m = evaluate(snapshot([("wörker", "верёвка", 2 * MS, 0), ("b", "верёвка", 0, 0)]))
    assert m.hot_lock_register[0]["lock"] == "верёвка"
    assert "верёвка" in m.to_json()


# ---------------------------------------------------------------------------------------------
# Streaming evaluation against a batch reference computed from raw acquisitions

raw_events = st.lists(
    st.tuples(
        st.sampled_from(["w0", "w1", "w2", "w3"]),
        st.sampled_from(["L0", "L1", "L2"]),
        st.integers(0, 30 * MS),
        st.integers(0, 5 * MS),
    ),
    max_size=40,
)


def reference(events, hot_pct=20.0, ratio=5.0):
    """The definitions of a hot lock and of starvation, computed directly from the raw events
    (a starved worker's wait is also at least 5 % of its observed time; a hot lock's wait is at
    least 10 % of the observed time of the pool's workers: the largest group of workers linked
    by the locks they share and the other groups of two or more at least half its size, found
    here by a search over the sharing relation)."""
    lock_wait: dict = {}
    pair_wait: dict = {}
    for worker, lock, wait, _ in events:
        lock_wait[lock] = lock_wait.get(lock, 0) + wait
        pair_wait[(worker, lock)] = pair_wait.get((worker, lock), 0) + wait
    total = sum(lock_wait.values())
    users = {lock: {w for (w, lk) in pair_wait if lk == lock} for lock in lock_wait}
    groups, seen = [], set()
    for start in sorted({w for w, _ in pair_wait}):
        if start in seen:
            continue
        group, todo = set(), [start]
        while todo:
            w = todo.pop()
            if w not in group:
                group.add(w)
                todo += [u for ws in users.values() if w in ws for u in ws]
        seen |= group
        groups.append(group)
    largest = max(map(len, groups), default=0)
    pool = set().union(
        *(g for g in groups if (len(g) >= 2 and 2 * len(g) >= largest) or largest < 2)
    )
    observed = sum(wait + hold for w, _, wait, hold in events if w in pool)
    hot = sorted(
        (
            lock
            for lock, w in lock_wait.items()
            if w >= MS and w * 100 >= hot_pct * total and w * 100 >= 10 * observed
        ),
        key=lambda lock: (-lock_wait[lock], lock),
    )
    observed_by_worker: dict = {}
    for worker, _, wait, hold in events:
        observed_by_worker[worker] = observed_by_worker.get(worker, 0) + wait + hold
    starving = set()
    for lock in lock_wait:
        waits = [w for (_, lk), w in pair_wait.items() if lk == lock]
        median = statistics.median_low(waits)
        for (worker, lk), w in pair_wait.items():
            if (
                lk == lock
                and w > ratio * max(median, 0.2 * MS)
                and w >= MS
                and w * 100 >= 5 * observed_by_worker[worker]
            ):
                starving.add((worker, lock))
    return hot, starving


@settings(max_examples=150, deadline=None)
@given(raw_events)
def test_streaming_evaluation_matches_the_batch_reference(events):
    m = evaluate(snapshot(events))
    hot, starving = reference(events)
    assert [h["lock"] for h in m.hot_lock_register] == hot
    assert {(s["worker"], s["lock"]) for s in m.starvation_signatures} == starving
    for h in m.hold_time_distribution.values():
        assert h["count"] > 0
    for lock, entry in m.locks.items():
        waits = sorted(w for _, lk, w, _ in events if lk == lock)
        exact_p95 = waits[max(1, -(-95 * len(waits) // 100)) - 1]
        assert abs(entry["wait"]["p95_ms"] * MS - exact_p95) <= RELATIVE_ERROR * exact_p95 + 1e-6


# ---------------------------------------------------------------------------------------------
# File format


def current_umask() -> int:
    """The process's umask, read without setting it (``os.umask`` would, for every thread)."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    raise AssertionError("no Umask line in /proc/self/status")


def test_dump_and_load_round_trip(tmp_path):
    m = evaluate(snapshot(hot_pool_events(), pool=EXECUTOR_8))
    path = dump_manifest(m, tmp_path / "manifest.json")
    assert path == tmp_path / "manifest.json"
    assert path.read_text(encoding="utf-8") == m.to_json()
    loaded = load_manifest(path)
    assert loaded == m
    assert loaded.to_dict() == m.to_dict()
    assert loaded.verdict is Verdict.HOT_LOCK_DETECTED
    assert loaded.recommended_pool_size == 3
    assert (os.stat(path).st_mode & 0o777) == 0o666 & ~current_umask()  # as any new file
    assert os.listdir(tmp_path) == ["manifest.json"]


def test_dump_replaces_pid_in_the_path(tmp_path):
    path = dump_manifest(evaluate(snapshot([])), str(tmp_path / "lockwatch-{pid}.json"))
    assert path == tmp_path / f"lockwatch-{os.getpid()}.json"
    assert path.exists()


def test_failed_dump_leaves_the_previous_manifest_and_no_temp_file(tmp_path, monkeypatch):
    """An error during the write (here at the rename) removes the temporary file; the previous
    manifest survives intact."""
    path = tmp_path / "manifest.json"
    old = evaluate(snapshot([]))
    dump_manifest(old, path)
    before = path.read_bytes()

    def broken_replace(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(_io.os, "replace", broken_replace)
    with pytest.raises(OSError, match=r"No space left on device"):
        dump_manifest(evaluate(snapshot(hot_pool_events())), path)
    assert path.read_bytes() == before
    assert os.listdir(tmp_path) == ["manifest.json"]


def test_dump_interrupted_before_fsync_leaves_nothing(tmp_path, monkeypatch):
    def interrupted(fd):
        raise KeyboardInterrupt

    monkeypatch.setattr(_io.os, "fsync", interrupted)
    with pytest.raises(KeyboardInterrupt):
        dump_manifest(evaluate(snapshot([])), tmp_path / "m.json")
    assert os.listdir(tmp_path) == []


def test_dump_refuses_other_objects(tmp_path):
    with pytest.raises(TypeError, match=r"^manifest must be a Manifest, got dict$"):
        dump_manifest({}, tmp_path / "m.json")


def write(tmp_path, text: str | bytes):
    path = tmp_path / "m.json"
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text, encoding="utf-8")
    return path


def edited(tmp_path, change):
    doc = evaluate(snapshot(hot_pool_events(), pool=EXECUTOR_8)).to_dict()
    change(doc)
    return write(tmp_path, json.dumps(doc))


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda p: p / "absent.json", r"^manifest .*absent\.json does not exist$"),
        (lambda p: p, r"^manifest .* is not a regular file: it is a directory$"),
        (lambda p: write(p, "{not json"), r"^manifest .*m\.json is not valid JSON: Expecting "),
        (lambda p: write(p, b"\xff\xfe"), r"^manifest .*m\.json is not UTF-8 text \(byte 0\)$"),
        (lambda p: write(p, "[1, 2]"), r"^manifest .*m\.json is not a JSON object$"),
        (
            lambda p: write(p, '{"schema": "other/2"}'),
            r"^manifest .*m\.json has schema 'other/2', expected 'otel-lockwatch/manifest/4'$",
        ),
        (
            lambda p: edited(p, lambda d: d.pop("thresholds")),
            r"^manifest .*m\.json lacks field\(s\): thresholds$",
        ),
        (
            lambda p: edited(p, lambda d: d.update(recommended_pool_size=16)),
            r"^manifest .*m\.json was edited: its manifest_digest does not match its content$",
        ),
        (
            lambda p: edited(p, lambda d: d["locks"]["global_config"].update(acquisitions=1)),
            r"^manifest .*m\.json was edited: its manifest_digest does not match its content$",
        ),
    ],
)
def test_load_refuses_bad_manifests_with_one_line(tmp_path, make, message):
    with pytest.raises(ManifestError, match=message) as info:
        load_manifest(make(tmp_path))
    assert "\n" not in str(info.value)


def test_load_refuses_consistent_but_invalid_content(tmp_path):
    """A document whose digest was recomputed after breaking its data is still refused."""
    doc = evaluate(snapshot([("a", "l", 0, 0)])).to_dict()
    doc["locks"]["l"]["acquisitions"] = -3
    doc["manifest_digest"] = compute_digest(doc)
    with pytest.raises(
        ManifestError,
        match=r"^manifest .*m\.json is invalid: locks\['l'\]\.acquisitions must be an int >= 0, "
        r"got -3$",
    ):
        load_manifest(write(tmp_path, json.dumps(doc)))


# ---------------------------------------------------------------------------------------------
# Admission check and recommended_workers


def starved_manifest() -> Manifest:
    events = [(f"w{i}", "shared", 0, 0) for i in range(15)] + [("w15", "shared", 50 * MS, 0)]
    return evaluate(snapshot(events, pool={"nominal": 16, "source": "executor"}))


def test_may_spawn_pool_size_both_ways():
    m = starved_manifest()
    assert m.recommended_pool_size == 8
    assert may_spawn_pool_size(m, 16) == (
        False,
        "POOL_SIZE_VIOLATION: Requested 16 exceeds recommended 8 (the verdict's share: the "
        "workers did nothing but wait; verdict STARVATION_OBSERVED).",
    )
    ok, reason = may_spawn_pool_size(m, 8)
    assert ok is True
    assert reason.startswith("POOL_SIZE_ADMISSIBLE")
    assert may_spawn_pool_size(m, 1)[0] is True


@pytest.mark.parametrize(
    ("requested", "error", "message"),
    [
        (0, ValueError, r"^requested must be >= 1, got 0$"),
        (2.5, TypeError, r"^requested must be an int, got 2\.5$"),
        (True, TypeError, r"^requested must be an int, got True$"),
    ],
)
def test_may_spawn_pool_size_refuses_nonsense(requested, error, message):
    with pytest.raises(error, match=message):
        may_spawn_pool_size(starved_manifest(), requested)


def test_recommended_workers_with_and_without_a_file(tmp_path):
    path = tmp_path / "m.json"
    assert recommended_workers(path, 16) == 16
    dump_manifest(starved_manifest(), path)
    assert recommended_workers(path, 16) == 8
    assert recommended_workers(str(path), 3) == 8


def test_recommended_workers_does_not_trust_an_edited_manifest(tmp_path, caplog):
    """An edited (or corrupt) manifest neither crashes the successor nor is trusted: a warning
    and the default."""
    path = edited(tmp_path, lambda d: d.update(recommended_pool_size=64))
    with caplog.at_level(logging.WARNING, logger="otel_lockwatch"):
        assert recommended_workers(path, 4) == 4
    [record] = caplog.records
    assert record.getMessage().startswith("not trusting the last manifest, using 4 workers: ")
    assert "was edited" in record.getMessage()


def test_recommended_workers_refuses_a_bad_default(tmp_path):
    with pytest.raises(ValueError, match=r"^default must be >= 1, got 0$"):
        recommended_workers(tmp_path / "m.json", 0)
