"""Tests of merging: ``merge_manifests`` (exact merging of the data parts, the merge properties:
associative, commutative, self-merge doubles counts and keeps percentiles; cross-process
lock-order cycles, the parent's pool size) and the recorder's snapshot, which is a merge by the
same routine."""

from __future__ import annotations

import json

import pytest
from _snapshots import locks_and_workers, merged_as_shares
from hypothesis import given, settings
from hypothesis import strategies as st

from otel_lockwatch import _settings
from otel_lockwatch.exceptions import ManifestError
from otel_lockwatch.manifest._evaluate import evaluate
from otel_lockwatch.manifest._io import dump_manifest
from otel_lockwatch.manifest._merge import merge_manifests
from otel_lockwatch.manifest._model import Verdict
from otel_lockwatch.record._data import expand_lock_workers, merge_data
from otel_lockwatch.record._histogram import LogHistogram, bucket_of
from otel_lockwatch.record._lock_class import lock_class
from otel_lockwatch.record._recorder import Recorder
from otel_lockwatch.record._sites import UNKNOWN, SiteTable
from otel_lockwatch.record._stats import Stats

MS = 1_000_000


def snapshot(events, *, pid, pool=None, edges=(), sections=None, blocking=None, start="00"):
    """A recorder snapshot of raw acquisitions ``(worker, lock, wait_ns, hold_ns)`` in process
    ``pid``; ``edges`` are lock-order edges ``(holding, acquiring, worker, at_second)``."""
    locks, workers = locks_and_workers(events)
    witnesses = [
        {
            "holding": a,
            "acquiring": b,
            "worker": w,
            "sites": ["app.py:f:1", "app.py:g:2"],
            "at": f"2026-10-26T12:00:{at:02d}.000Z",
            "trace_id": None,
            "span_id": None,
        }
        for a, b, w, at in edges
    ]
    from otel_lockwatch.record._cycles import merge_order_data

    order = merge_order_data([{"edges": witnesses, "cycles": []}])
    return {
        "locks": locks,
        "workers": workers,
        "lock_order": order,
        "blocking_under_lock": blocking or {},
        "sections": sections or {},
        "pool": pool or {"nominal": None, "source": None},
        "process": {
            "pid": pid,
            "service.name": "svc",
            "start": f"2026-10-26T12:{start}:00.000Z",
            "end": "2026-10-26T12:59:00.000Z",
        },
    }


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    for setting in _settings.SETTINGS.values():
        monkeypatch.delenv(setting.variable, raising=False)


# ---------------------------------------------------------------------------------------------
# Strategies: small process manifests with every kind of data

events = st.lists(
    st.tuples(
        st.sampled_from(["MainThread", "w1", "w2"]),
        st.sampled_from(["L0", "L1", "L2"]),
        st.integers(0, 20 * MS),
        st.integers(0, 3 * MS),
    ),
    max_size=25,
)
edges = st.lists(
    st.tuples(
        st.sampled_from(["L0", "L1", "L2"]),
        st.sampled_from(["L0", "L1", "L2"]),
        st.sampled_from(["w1", "w2"]),
        st.integers(0, 59),
    ).filter(lambda e: e[0] != e[1]),
    max_size=3,
    unique_by=lambda e: (e[0], e[1]),
)
pools = st.sampled_from(
    [None, {"nominal": 4, "source": "executor"}, {"nominal": 6, "source": "env"}]
)
sections = st.one_of(
    st.none(),
    st.builds(
        lambda c, w, k: {"emitter": {"count": c, "collision_waits": w, "max_held": k}},
        st.sampled_from([16, 64, 256]),
        st.integers(0, 50),
        st.integers(0, 20),
    ),
)
blocking = st.one_of(st.none(), st.builds(lambda n: {"L0": {"db.query": n}}, st.integers(1, 5)))


@st.composite
def manifests(draw):
    return evaluate(
        snapshot(
            draw(events),
            pid=draw(st.sampled_from([101, 202, 303])),
            pool=draw(pools),
            edges=draw(edges),
            sections=draw(sections),
            blocking=draw(blocking),
            start=draw(st.sampled_from(["00", "05", "10"])),
        )
    )


# ---------------------------------------------------------------------------------------------
# Properties


@settings(max_examples=60, deadline=None)
@given(manifests(), manifests())
def test_merge_is_commutative(a, b):
    """Same inputs, any order: the same manifest, digest included."""
    assert merge_manifests([a, b]).to_json() == merge_manifests([b, a]).to_json()


@settings(max_examples=60, deadline=None)
@given(manifests(), manifests(), manifests())
def test_merge_is_associative(a, b, c):
    """However the inputs are grouped: the same manifest, digest included."""
    flat = merge_manifests([a, b, c])
    assert merge_manifests([merge_manifests([a, b]), c]).to_json() == flat.to_json()
    assert merge_manifests([a, merge_manifests([b, c])]).to_json() == flat.to_json()


@settings(max_examples=60, deadline=None)
@given(st.lists(manifests(), min_size=1, max_size=5), st.integers(0, 5))
def test_a_merge_folded_in_shares_is_the_merge(ms, cut):
    """Folded in two shares (as ``merge --jobs`` does, one share's fold pickled): the same
    manifest, digest included."""
    assert merged_as_shares(ms, cut) == merge_manifests(ms).to_json()


@settings(max_examples=60, deadline=None)
@given(manifests())
def test_merging_a_manifest_with_itself_doubles_counts_and_keeps_percentiles(m):
    once, twice = merge_manifests([m]), merge_manifests([m, m])
    assert twice.locks.keys() == once.locks.keys()
    for name, lock in once.locks.items():
        doubled = twice.locks[name]
        for key in ("acquisitions", "contentions", "skipped", "timeouts"):
            assert doubled[key] == 2 * lock[key]
        for hist in ("wait_ns", "hold_ns"):
            assert doubled[hist]["count"] == 2 * lock[hist]["count"]
            assert doubled[hist]["sum"] == 2 * lock[hist]["sum"]
        assert doubled["wait"] == lock["wait"] and doubled["hold"] == lock["hold"]
        assert doubled["workers"] == {
            w: {k: 2 * v for k, v in t.items()} for w, t in lock["workers"].items()
        }
    assert twice.workers == {w: {k: 2 * v for k, v in t.items()} for w, t in once.workers.items()}
    for name, s in once.sections.items():
        assert twice.sections[name]["collision_waits"] == 2 * s["collision_waits"]
        assert twice.sections[name]["max_held"] == s["max_held"]
    assert twice.blocking_under_lock == {
        lock: {span: 2 * n for span, n in spans.items()}
        for lock, spans in once.blocking_under_lock.items()
    }
    assert twice.effective_throughput_pct == once.effective_throughput_pct
    assert twice.lock_order == once.lock_order
    assert twice.process["merged"] == 2 and twice.process["pids"] == once.process["pids"]


@settings(max_examples=60, deadline=None)
@given(events, events)
def test_merge_equals_evaluating_all_acquisitions_at_once(first, second):
    """Two processes merged give exactly what one snapshot of all their acquisitions gives,
    with workers named "<pid>/<name>"."""
    merged = merge_manifests([evaluate(snapshot(first, pid=1)), evaluate(snapshot(second, pid=2))])
    renamed = [(f"1/{w}", *rest) for w, *rest in first] + [(f"2/{w}", *rest) for w, *rest in second]
    whole = evaluate(snapshot(renamed, pid=0))
    for field in (
        "locks",
        "workers",
        "hot_lock_register",
        "hold_time_distribution",
        "starvation_signatures",
        "effective_throughput_pct",
        "verdict",
        "nominal_pool_size",
        "recommended_pool_size",
    ):
        assert getattr(merged, field) == getattr(whole, field), field


# ---------------------------------------------------------------------------------------------
# Scenarios


def test_cross_process_cycle():
    """A->B seen only in one process and B->A only in another is a cycle in the code."""
    a = evaluate(snapshot([("t1", "A", 0, 0)], pid=11, edges=[("A", "B", "t1", 1)]))
    b = evaluate(snapshot([("t2", "B", 0, 0)], pid=22, edges=[("B", "A", "t2", 2)]))
    assert a.verdict is b.verdict is Verdict.LOW_CONTENTION
    merged = merge_manifests([a, b])
    assert merged.verdict is Verdict.CYCLIC_ORDERING_DETECTED
    [cycle] = merged.pre_deadlock_ordering_witness
    assert cycle["cycle"] == ["A", "B"]
    assert [(e["holding"], e["acquiring"], e["worker"]) for e in cycle["edges"]] == [
        ("A", "B", "11/t1"),
        ("B", "A", "22/t2"),
    ]


def test_pool_size_comes_from_the_parent():
    """The parent knew its ProcessPoolExecutor's max_workers; the children did not."""
    parent = evaluate(snapshot([], pid=1, pool={"nominal": 4, "source": "executor"}))
    children = [evaluate(snapshot([(f"w{i}", "L", 0, 0)], pid=10 + i)) for i in range(6)]
    merged = merge_manifests([*children, parent])
    assert (merged.nominal_pool_size, merged.pool_size_source) == (4, "executor")
    assert merged.pool == {"nominal": 4, "source": "executor"}
    assert merge_manifests(children).pool_size_source == "observed"
    assert merge_manifests(children).nominal_pool_size == 6
    env_child = evaluate(snapshot([], pid=9, pool={"nominal": 16, "source": "env"}))
    assert merge_manifests([env_child, parent]).nominal_pool_size == 4


def test_merged_process_and_worker_names():
    a = evaluate(snapshot([("w", "L", 0, 0)], pid=7, start="03"))
    b = evaluate(snapshot([("w", "L", 0, 0)], pid=5, start="01"))
    merged = merge_manifests([a, b])
    assert merged.process == {
        "pids": [5, 7],
        "service.name": "svc",
        "service.names": ["svc"],
        "start": "2026-10-26T12:01:00.000Z",
        "end": "2026-10-26T12:59:00.000Z",
        "merged": 2,
    }
    assert sorted(merged.workers) == ["5/w", "7/w"]
    again = merge_manifests([merged, evaluate(snapshot([("w", "L", 0, 0)], pid=9))])
    assert sorted(again.workers) == ["5/w", "7/w", "9/w"]
    assert again.process["merged"] == 3


def test_merge_accepts_paths_and_dicts_and_checks_them(tmp_path):
    a = evaluate(snapshot([("w", "L", 3 * MS, 0)], pid=1))
    b = evaluate(snapshot([("w", "L", 0, 0)], pid=2))
    path = dump_manifest(a, tmp_path / "a.json")
    expected = merge_manifests([a, b])
    assert merge_manifests([path, b.to_dict()]) == expected
    assert merge_manifests([str(path), json.loads(b.to_json())]) == expected
    doc = b.to_dict()
    doc["locks"]["L"]["acquisitions"] = 100
    with pytest.raises(
        ManifestError,
        match=r"^manifest was edited: its manifest_digest does not match its content$",
    ):
        merge_manifests([a, doc])
    with pytest.raises(ManifestError, match=r"^manifest .*absent\.json does not exist$"):
        merge_manifests([tmp_path / "absent.json"])


def test_merge_refuses_nothing_and_other_types():
    with pytest.raises(ValueError, match=r"^merge_manifests needs at least one manifest$"):
        merge_manifests([])
    with pytest.raises(TypeError, match=r"^cannot merge a int: expected a Manifest, dict or path$"):
        merge_manifests([3])


def test_merge_thresholds():
    """The inputs' shared thresholds carry over; differing ones fall back to the defaults; an
    argument wins."""
    data = snapshot([("w", "L", 0, 0)], pid=1)
    a30 = evaluate(data, hot_lock_threshold_pct=30)
    b30 = evaluate(snapshot([], pid=2), hot_lock_threshold_pct=30)
    b50 = evaluate(snapshot([], pid=2), hot_lock_threshold_pct=50)
    assert merge_manifests([a30, b30]).thresholds["hot_lock_threshold_pct"] == 30.0
    assert merge_manifests([a30, b50]).thresholds["hot_lock_threshold_pct"] == 20.0
    # Folded in shares: a share that saw differing thresholds passes that on, through pickling.
    differing = [a30, b50, b30]
    assert merged_as_shares(differing, 2) == merge_manifests(differing).to_json()
    assert json.loads(merged_as_shares(differing, 2))["thresholds"]["hot_lock_threshold_pct"] == 20
    assert json.loads(merged_as_shares([a30, b30], 1))["thresholds"]["hot_lock_threshold_pct"] == 30
    merged = merge_manifests([a30, b30], hot_lock_threshold_pct=60, starvation_ratio=2)
    assert merged.thresholds["hot_lock_threshold_pct"] == 60.0
    assert merged.thresholds["starvation_ratio"] == 2.0
    with pytest.raises(ValueError, match=r"^starvation_ratio must be a number > 1, got 0\.5$"):
        merge_manifests([a30], starvation_ratio=0.5)


def test_hot_lock_spread_over_processes():
    """Each of 4 processes waits a little on `registry`; merged, it is the hot lock and the
    acquisition count is exactly the sum."""
    parts = [
        evaluate(
            snapshot(
                [(f"w{j}", "registry", 2 * MS, MS) for j in range(3)]
                + [(f"w{j}", f"own_{pid}", 0, MS) for j in range(3)],
                pid=pid,
            )
        )
        for pid in (1, 2, 3, 4)
    ]
    merged = merge_manifests(parts)
    assert merged.locks["registry"]["acquisitions"] == 12
    assert merged.hot_lock_register[0]["lock"] == "registry"
    assert merged.hot_lock_register[0]["wait_ms"] == 24.0
    assert merged.verdict is Verdict.HOT_LOCK_DETECTED


# ---------------------------------------------------------------------------------------------
# The recorder's snapshot is a merge of the same kind

# One recorder for these tests (a Recorder registers an at-fork hook: make one, not one per
# example); each example resets it.
RECORDER = Recorder()

# What one acquisition attempt leaves in a worker's Stats, as the hot path writes it:
# (lock class, outcome, wait_ns, hold_ns); a wait of 0 is an uncontended acquisition.
attempts = st.lists(
    st.tuples(
        st.sampled_from([("L0", "threading.Lock"), ("L1", "threading.RLock"), ("S", "section")]),
        st.sampled_from(["blocking", "try", "skipped", "timeout"]),
        st.integers(0, 20 * MS),
        st.integers(0, 3 * MS),
    ),
    max_size=20,
)
spans_under_lock = st.dictionaries(
    st.tuples(st.sampled_from(["L0", "L1"]), st.sampled_from(["db.query", "http.get"])),
    st.integers(1, 5),
    max_size=3,
)
collisions = st.integers(0, 4)


def record(state, attempts, spans, collision_waits, observed_ns):
    """Write ``attempts`` into a worker state's Stats as the lock wrappers do, and their waits'
    sites as the filer then does (``record._waits``), at ``(unknown)``: every wait counted has
    its site filed by the time a snapshot reads (one counted and not filed yet is charged to
    ``(unknown)`` there too)."""
    for (name, kind), outcome, wait, hold in attempts:
        s = state.stats.setdefault(lock_class(name, kind), Stats())
        if outcome == "skipped":
            s.skipped += 1
            continue
        if outcome == "try":
            s.try_acquisitions += 1
        elif wait:
            s.contentions += 1
            s.wait_total_ns += wait
            b = bucket_of(wait)
            s.wait_histogram[b] = s.wait_histogram.get(b, 0) + 1
            s.wait_min_ns, s.wait_max_ns = min(s.wait_min_ns, wait), max(s.wait_max_ns, wait)
            if s.sites is None:
                s.sites = SiteTable()
            s.sites.add(UNKNOWN, UNKNOWN, wait)
            if name == "S":
                s.collisions += collision_waits
        if outcome == "timeout":
            s.timeouts += 1
            continue
        s.acquisitions += 1
        s.hold_total_ns += hold
        b = bucket_of(hold)
        s.hold_histogram[b] = s.hold_histogram.get(b, 0) + 1
        s.hold_min_ns, s.hold_max_ns = min(s.hold_min_ns, hold), max(s.hold_max_ns, hold)
    state.spans.update(spans)
    state.first, state.last = 0, observed_ns


class _Track:
    """A section array's tracking, as the recorder sees it (``capture._sections.ArrayTrack``)."""

    def __init__(self, name, count, max_held):
        self.name, self.count, self.max_held = name, count, max_held


def snapshot_of(workers):
    """The recorder's snapshot of the given workers' work: ``(name, recording)`` pairs, where a
    recording is ``(attempts, spans, collision_waits, observed_ns)``."""
    RECORDER.reset()
    RECORDER.note_array(_Track("S", 16, 3))
    RECORDER.note_pool(8, "executor")
    for name, recording in workers:
        record(RECORDER.register(name), *recording)
    return RECORDER.snapshot()


recordings = st.tuples(attempts, spans_under_lock, collisions, st.integers(0, 10**9))


def reference_locks(workers):
    """The ``locks`` part computed from the attempts themselves: every blocking attempt is a wait
    sample (0 when uncontended), every acquisition a hold sample."""
    locks: dict = {}
    for worker, (attempts, *_) in workers:
        for (name, kind), outcome, wait, hold in attempts:
            lock = locks.setdefault(
                name,
                {
                    "kind": kind,
                    "acquisitions": 0,
                    "contentions": 0,
                    "skipped": 0,
                    "timeouts": 0,
                    "wait_ns": LogHistogram(),
                    "hold_ns": LogHistogram(),
                    "workers": {},
                },
            )
            totals = lock["workers"].setdefault(
                worker, {"acquisitions": 0, "contentions": 0, "wait_ns": 0, "hold_ns": 0}
            )
            if outcome == "skipped":
                lock["skipped"] += 1
                continue
            if outcome in ("blocking", "timeout"):
                lock["wait_ns"].add(wait)
                lock["contentions"] += wait > 0
                totals["contentions"] += wait > 0
                totals["wait_ns"] += wait
                if wait:  # at its site, (unknown) here
                    waits = lock.setdefault("contention_points", {UNKNOWN: LogHistogram()})
                    waits[UNKNOWN].add(wait)
                    holders = lock.setdefault(
                        "contending_points", {UNKNOWN: {"count": 0, "wait_ns": 0}}
                    )
                    holders[UNKNOWN]["count"] += 1
                    holders[UNKNOWN]["wait_ns"] += wait
            if outcome == "timeout":
                lock["timeouts"] += 1
                continue
            lock["acquisitions"] += 1
            lock["hold_ns"].add(hold)
            totals["acquisitions"] += 1
            totals["hold_ns"] += hold
    return locks


@settings(max_examples=100, deadline=None)
@given(recordings, recordings, st.sampled_from(["A", "B"]))
def test_snapshot_of_two_threads_is_the_merge_of_their_snapshots(a, b, b_name):
    """The recorder's snapshot of two threads' work holds exactly their attempts, and equals
    merge_data of the snapshots of each thread's work alone (the same thread name twice is one
    worker, whose totals add)."""
    workers = [("A", a), (b_name, b)]
    both = snapshot_of(workers)
    assert both["locks"] == reference_locks(workers)
    merged = expand_lock_workers(merge_data([snapshot_of([("A", a)]), snapshot_of([(b_name, b)])]))
    for field in ("locks", "workers", "blocking_under_lock", "sections", "pool", "lock_order"):
        assert merged[field] == both[field], field


# ---------------------------------------------------------------------------------------------
# Derived fields: a merge refuses what report and check refuse


@pytest.mark.parametrize("recommended", [-1, 10**18, 3])
def test_merge_refuses_derived_fields_its_data_does_not_give(tmp_path, capsys, recommended):
    """A recommended size of -1, 10**18 (or merely another one) with its digest recomputed:
    report and check refused it, merge took it (exit 0)."""
    from otel_lockwatch.cli._main import main
    from otel_lockwatch.manifest._model import compute_digest

    manifest = evaluate(snapshot([("w1", "L", 3 * MS, MS), ("w2", "L", 0, MS)], pid=1))
    doc = manifest.to_dict()
    assert doc["recommended_pool_size"] not in (-1, 10**18, 3)
    doc["recommended_pool_size"] = recommended
    doc["manifest_digest"] = compute_digest(doc)
    path = tmp_path / "m.json"
    path.write_text(json.dumps(doc, sort_keys=True, indent=2, ensure_ascii=False))
    expected = (
        f"manifest {path} does not agree with its data: recommended_pool_size is {recommended}, "
        f"its data gives {manifest.recommended_pool_size}"
    )
    out = tmp_path / "out.json"
    for command in (["report", str(path)], ["merge", str(path), "-o", str(out)]):
        assert main(command) == 2
        assert capsys.readouterr().err == f"otel-lockwatch: error: {expected}\n"
    assert not out.exists()
    with pytest.raises(ManifestError, match=f"^{expected}$"):
        merge_manifests([path])
