"""Merging data parts that carry hand-off waits, pools, roles and peak workers.

The merge rules of the new fields (``record._data``): counts and per-worker numbers add,
histograms merge, ``capacity`` and ``in_use_peak`` take the largest known, ``role`` the least
given, ``peak_workers`` add, and each field is in the merge when a part has it. Like every other
rule they are commutative and associative, which the properties below check on the data parts
(``merge_data``) and on whole manifests (``merge_manifests``, digest included).
"""

from __future__ import annotations

import json

import pytest
from _snapshots import PoolRun, locks_and_workers, merged_as_shares, pool_data
from hypothesis import given, settings
from hypothesis import strategies as st

from otel_lockwatch import _settings
from otel_lockwatch.exceptions import ManifestError
from otel_lockwatch.manifest._check import MAX_POOL_SIZE
from otel_lockwatch.manifest._evaluate import evaluate
from otel_lockwatch.manifest._merge import merge_manifests
from otel_lockwatch.manifest._model import canonical_json
from otel_lockwatch.record._data import merge_data
from otel_lockwatch.record._histogram import LogHistogram

MS = 1_000_000
WORKERS = ["w1", "w2", "w3"]


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    for setting in _settings.SETTINGS.values():
        monkeypatch.delenv(setting.variable, raising=False)


# ---------------------------------------------------------------------------------------------
# Strategies: data parts with the pool fields on some classes

signal_workers = st.dictionaries(
    st.sampled_from(WORKERS),
    st.fixed_dictionaries(
        {
            "waits": st.integers(0, 5),
            "wait_ns": st.integers(0, 50 * MS),
            "signals": st.integers(0, 5),
        }
    ),
    max_size=3,
)


@st.composite
def signal_waits(draw):
    samples = draw(st.lists(st.integers(0, 50 * MS), max_size=8))
    return {
        "count": len(samples),
        "timeouts": draw(st.integers(0, len(samples))),
        "wait_ns": LogHistogram(samples),
        "workers": draw(signal_workers),
    }


optional_size = st.one_of(st.none(), st.integers(0, 16))
pools = st.builds(
    lambda capacity, peak, holds: {
        "capacity": capacity,
        "in_use_peak": peak,
        "checkouts": len(holds),
        "hold_ns": LogHistogram(holds),
    },
    optional_size,
    optional_size,
    st.lists(st.integers(0, 20 * MS), max_size=6),
)
roles = st.sampled_from([None, "queue.Queue.not_empty", "queue.Queue.not_full"])


@st.composite
def data_parts(draw):
    events = draw(
        st.lists(
            st.tuples(
                st.sampled_from(WORKERS),
                st.sampled_from(["pool", "cond", "L0"]),
                st.integers(0, 5 * MS),
                st.integers(0, 3 * MS),
            ),
            max_size=12,
        )
    )
    locks, workers = locks_and_workers(events, idle_ns=100 * MS)
    for name in ("pool", "cond"):
        if name not in locks:
            continue
        if draw(st.booleans()):
            locks[name]["signal_waits"] = draw(signal_waits())
        if name == "pool" and draw(st.booleans()):
            locks[name]["pool"] = draw(pools)
        role = draw(roles)
        if role is not None:
            locks[name]["role"] = role
    for name in ("pool", "cond"):  # a signal worker the part never observed is observed now
        for w in locks.get(name, {}).get("signal_waits", {}).get("workers", {}):
            workers.setdefault(w, {"observed_ns": 100 * MS, "wait_ns": 0})
    pool = {"nominal": None, "source": None}
    peak = draw(st.one_of(st.none(), st.integers(1, 8)))
    if peak is not None:
        pool["peak_workers"] = peak
    return {"locks": locks, "workers": workers, "pool": pool}


@st.composite
def manifests(draw):
    part = draw(data_parts())
    part["process"] = {"pid": draw(st.sampled_from([101, 202, 303])), "service.name": "svc"}
    return evaluate(part)


def key(data) -> bytes:
    return canonical_json(data)


# ---------------------------------------------------------------------------------------------
# Properties


@settings(max_examples=80, deadline=None)
@given(data_parts(), data_parts())
def test_merging_pool_fields_is_commutative(a, b):
    assert key(merge_data([a, b])) == key(merge_data([b, a]))


@settings(max_examples=80, deadline=None)
@given(data_parts(), data_parts(), data_parts())
def test_merging_pool_fields_is_associative(a, b, c):
    flat = key(merge_data([a, b, c]))
    assert key(merge_data([merge_data([a, b]), c])) == flat
    assert key(merge_data([a, merge_data([b, c])])) == flat


@settings(max_examples=40, deadline=None)
@given(manifests(), manifests(), manifests())
def test_merging_manifests_with_pools_is_commutative_and_associative(a, b, c):
    """The same manifest, digest included, whatever the order and grouping."""
    flat = merge_manifests([a, b, c]).to_json()
    assert merge_manifests([c, a, b]).to_json() == flat
    assert merge_manifests([merge_manifests([a, b]), c]).to_json() == flat
    assert merge_manifests([a, merge_manifests([b, c])]).to_json() == flat


@settings(max_examples=40, deadline=None)
@given(st.lists(manifests(), min_size=1, max_size=4), st.integers(0, 4))
def test_a_merge_with_pools_folded_in_shares_is_the_merge(ms, cut):
    assert merged_as_shares(ms, cut) == merge_manifests(ms).to_json()


@settings(max_examples=60, deadline=None)
@given(data_parts())
def test_a_part_merged_with_itself_doubles_counts_and_keeps_sizes(part):
    once, twice = merge_data([part]), merge_data([part, part])
    assert twice["pool"].get("peak_workers") == (
        None if "peak_workers" not in part["pool"] else 2 * part["pool"]["peak_workers"]
    )
    for name, lock in once["locks"].items():
        doubled = twice["locks"][name]
        assert doubled.get("role") == lock.get("role")
        if "signal_waits" in lock:
            s, d = lock["signal_waits"], doubled["signal_waits"]
            assert (d["count"], d["timeouts"]) == (2 * s["count"], 2 * s["timeouts"])
            assert d["wait_ns"].percentiles((0.5, 0.95)) == s["wait_ns"].percentiles((0.5, 0.95))
            assert d["workers"] == {
                w: {k: 2 * v for k, v in t.items()} for w, t in s["workers"].items()
            }
        else:
            assert "signal_waits" not in doubled
        if "pool" in lock:
            p, d = lock["pool"], doubled["pool"]
            assert (d["capacity"], d["in_use_peak"]) == (p["capacity"], p["in_use_peak"])
            assert (d["checkouts"], d["hold_ns"].count) == (
                2 * p["checkouts"],
                2 * p["hold_ns"].count,
            )
        else:
            assert "pool" not in doubled


# ---------------------------------------------------------------------------------------------
# The rules, one by one


def test_the_merge_rules_of_the_pool_fields():
    def part(capacity, peak, role, signals, peak_workers=None):
        entry = {
            "kind": "queue.LifoQueue",
            "acquisitions": 0,
            "contentions": 0,
            "skipped": 0,
            "timeouts": 0,
            "wait_ns": LogHistogram(),
            "hold_ns": LogHistogram(),
            "workers": {},
            "signal_waits": {
                "count": 2,
                "timeouts": 1,
                "wait_ns": LogHistogram([MS, 3 * MS]),
                "workers": {"w1": {"waits": 2, "wait_ns": 4 * MS, "signals": signals}},
            },
            "pool": {
                "capacity": capacity,
                "in_use_peak": peak,
                "checkouts": 5,
                "hold_ns": LogHistogram([2 * MS] * 5),
            },
        }
        if role is not None:
            entry["role"] = role
        pool = {"nominal": None, "source": None}
        if peak_workers is not None:
            pool["peak_workers"] = peak_workers
        return {"locks": {"q": entry}, "pool": pool}

    merged = merge_data(
        [
            part(4, None, None, 3, peak_workers=4),
            part(None, 2, "queue.Queue.not_full", 0),
            part(2, 3, "queue.Queue.not_empty", 1, peak_workers=6),
        ]
    )
    q = merged["locks"]["q"]
    assert q["role"] == "queue.Queue.not_empty"  # the least role given
    assert (q["pool"]["capacity"], q["pool"]["in_use_peak"]) == (4, 3)  # the largest known
    assert (q["pool"]["checkouts"], q["pool"]["hold_ns"].count) == (15, 15)
    s = q["signal_waits"]
    assert (s["count"], s["timeouts"], s["wait_ns"].sum) == (6, 3, 12 * MS)
    assert s["workers"] == {"w1": {"waits": 6, "wait_ns": 12 * MS, "signals": 4}}
    assert merged["pool"] == {"nominal": None, "source": None, "peak_workers": 10}
    assert "peak_workers" not in merge_data([part(1, 1, None, 1)])["pool"]


def test_merged_processes_qualify_their_signal_workers():
    """Two processes' w0 are two workers in the hand-off waits too, so that a worker's contention
    adds to its own wait and its own observed time judges its starvation."""
    a, b = (pool_data(PoolRun(4, 2), "semaphore") for _ in range(2))
    a["process"], b["process"] = {"pid": 1}, {"pid": 2}
    merged = merge_manifests([evaluate(a), evaluate(b)])
    signal_workers = merged.data["locks"]["app.db:make_pool:12"]["signal_waits"]["workers"]
    assert set(signal_workers) == set(merged.workers)


def test_merged_processes_add_their_peak_workers_into_the_nominal_size():
    """Processes run side by side: peaks of 4 and 3 workers make a pool of 7."""
    a, b = pool_data(PoolRun(4, 2), "semaphore"), pool_data(PoolRun(3, 2), "semaphore")
    a["process"], b["process"] = {"pid": 1}, {"pid": 2}
    merged = merge_manifests([evaluate(a), evaluate(b)])
    assert merged.pool["peak_workers"] == 7
    assert (merged.nominal_pool_size, merged.pool_size_source) == (7, "peak_workers")


# ---------------------------------------------------------------------------------------------
# Pool sizes are bounded: a forged size is refused, not carried into a fleet's recommendation


def forged(nominal: int | None = None, peak_workers: int | None = None, pid: int = 1):
    """A manifest, its digest valid and its derived fields its data's, claiming a pool size."""
    data = pool_data(PoolRun(4, 2), "semaphore")
    data["process"] = {"pid": pid}
    if nominal is not None:
        data["pool"] = {"nominal": nominal, "source": "executor"}
    if peak_workers is not None:
        data["pool"] = {**data.get("pool", {}), "peak_workers": peak_workers}
    return evaluate(data)


def collector_file(path, manifest) -> None:
    """``manifest`` sent as a process sends it, in the Collector's file."""
    from otel_lockwatch.manifest._fleet import EVENT_NAME, record_attributes, record_body

    instance = "ab" * 16
    attributes = [
        {"key": key, "value": {"stringValue": value}}
        if isinstance(value, str)
        else {"key": key, "value": {"boolValue": value}}
        if isinstance(value, bool)
        else {"key": key, "value": {"intValue": str(value)}}
        for key, value in record_attributes(manifest, instance, 1, True).items()
    ]
    record = {
        "eventName": EVENT_NAME,
        "body": {"stringValue": record_body(manifest, instance, 1, True)},
        "attributes": attributes,
    }
    line = {"resourceLogs": [{"scopeLogs": [{"logRecords": [record]}]}]}
    path.write_text(json.dumps(line) + "\n")


@pytest.mark.parametrize(
    ("claim", "field"),
    [({"nominal": 10**15}, "pool.nominal"), ({"peak_workers": 10**15}, "pool.peak_workers")],
    ids=["nominal", "peak_workers"],
)
def test_a_forged_pool_size_is_refused_by_merge_and_report(tmp_path, capsys, claim, field):
    """One record (or file) claiming 10**15 workers made a fleet's recommended size 5 x 10**14:
    above MAX_POOL_SIZE it is refused, one line naming the field, exit 2, no output."""
    from otel_lockwatch.cli._main import main
    from otel_lockwatch.manifest._io import dump_manifest

    manifest = forged(**claim)
    assert manifest.nominal_pool_size == 10**15  # evaluate() does not bound it (the lead's)
    record, file = tmp_path / "fleet.jsonl", tmp_path / "m.json"
    collector_file(record, manifest)
    dump_manifest(manifest, file)
    out = tmp_path / "out.json"
    expected = f"{field} is {10**15}, above the largest pool size {MAX_POOL_SIZE}"
    for argv in (["merge", str(record), "-o", str(out)], ["merge", str(file), "-o", str(out)]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and expected in err, err
        assert not out.exists()
    assert main(["report", str(file)]) == 2
    assert expected in capsys.readouterr().err
    # At the largest size the same record is taken.
    collector_file(record, forged(**{key: MAX_POOL_SIZE for key in claim}))
    assert main(["merge", str(record), "-o", str(out)]) == 0


def test_a_merge_whose_pool_size_passes_the_largest_is_refused():
    """Peak workers add across processes: past MAX_POOL_SIZE the merged manifest is refused
    (it could not be read back)."""
    half = MAX_POOL_SIZE // 2 + 1
    with pytest.raises(
        ManifestError, match=rf"nominal pool size {2 * half} is above .* {MAX_POOL_SIZE}"
    ):
        merge_manifests([forged(peak_workers=half, pid=1), forged(peak_workers=half, pid=2)])
    merged = merge_manifests([forged(peak_workers=half - 1, pid=p) for p in (1, 2)])
    assert merged.nominal_pool_size == 2 * half - 2
