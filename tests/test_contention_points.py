"""Contention points (the sites that waited) and contending points (the sites that held the lock
when a waiter arrived), the timeline, and how both merge and are checked when read back."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from _snapshots import merged_as_shares
from hypothesis import given
from hypothesis import strategies as st

from otel_lockwatch.exceptions import ManifestError
from otel_lockwatch.manifest._check import check_doc
from otel_lockwatch.manifest._io import load_manifest
from otel_lockwatch.manifest._merge import merge_manifests
from otel_lockwatch.manifest._model import compute_digest
from otel_lockwatch.record._data import merge_data
from otel_lockwatch.record._histogram import LogHistogram
from otel_lockwatch.record._sites import KEEP, OTHER, trim_points
from otel_lockwatch.record._timeline import MAX_BUCKETS, Timeline, merge_timelines

ROOT = Path(__file__).resolve().parent.parent
WORKLOAD = ROOT / "tests" / "data" / "points_workload.py"


def run_workload(which: str, manifest: Path, pure: bool = False) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("LOCKWATCH_DISABLE_EXTENSIONS", None)
    if pure:
        env["LOCKWATCH_DISABLE_EXTENSIONS"] = "1"
    done = subprocess.run(
        [sys.executable, str(WORKLOAD), which, str(manifest)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[dict, Path]]:
    """The workloads ``a``, ``b`` and ``ab`` (both in one process) on the C path, and ``ab``
    on the pure-Python path."""
    tmp = tmp_path_factory.mktemp("points")
    out = {}
    for which, pure in (("a", False), ("b", False), ("ab", False), ("ab-pure", True)):
        path = tmp / f"{which}.json"
        out[which] = (run_workload(which.split("-")[0], path, pure), path)
    return out


def test_points_name_the_waiting_and_the_holding_sites(runs):
    """Each wait is charged to the line that waited and to the line where the holder took the
    lock: a Lock's, an RLock's and a section array's."""
    points, _ = runs["ab"]
    assert points["alpha"] == {
        "waiters": {"__main__:wait_a:54": 3, "__main__:wait_b:68": 2},
        "holders": {"__main__:hold_a:49": 3, "__main__:hold_b:63": 2},
    }
    assert points["beta"] == {
        "waiters": {"__main__:wait_r:80": 1},
        "holders": {"__main__:hold_r:75": 1},
    }
    assert points["sections"] == {
        "waiters": {"__main__:wait_s:91": 1},
        "holders": {"__main__:hold_s:86": 1},
    }


def test_both_paths_record_the_same_points(runs):
    """The C fast path hands every wait to the Python slow path with the lock's hold object:
    the sites it records are the pure-Python path's."""
    assert runs["ab"][0] == runs["ab-pure"][0]


def _points(doc: dict[str, Any], lock: str) -> tuple[dict, dict]:
    entry = doc["locks"][lock]
    waits = {s: h["count"] for s, h in entry["contention_points"].items()}
    holds = {s: r["count"] for s, r in entry["contending_points"].items()}
    return waits, holds


def test_a_merge_of_two_processes_has_the_points_of_one_doing_both(runs):
    """Merged, the manifests of ``a`` and ``b`` have the sites and counts of the process that
    did both workloads, and each table's totals are exactly the sum of the parts' (and the
    lock's contentions and wait)."""
    part_a, part_b, both = (load_manifest(runs[k][1]) for k in ("a", "b", "ab"))
    merged = merge_manifests([part_a, part_b]).to_dict()
    one = both.to_dict()
    for lock in ("alpha", "beta", "sections"):
        assert _points(merged, lock) == _points(one, lock), lock
        entry = merged["locks"][lock]
        wait_sum = sum(h["sum"] for h in entry["contention_points"].values())
        held_sum = sum(r["wait_ns"] for r in entry["contending_points"].values())
        parts_sum = sum(
            h["sum"]
            for part in (part_a.to_dict(), part_b.to_dict())
            if lock in part["locks"] and "contention_points" in part["locks"][lock]
            for h in part["locks"][lock]["contention_points"].values()
        )
        assert wait_sum == held_sum == parts_sum == entry["wait_ns"]["sum"]
    assert merged["timeline"]["locks"].keys() >= {"alpha"}


def test_a_manifest_with_points_and_a_timeline_reads_back(runs):
    doc = json.loads(runs["ab"][1].read_text())
    assert check_doc(doc, "m").to_dict()["locks"]["alpha"]["contention_points"]
    timeline = doc["timeline"]
    assert timeline["width_ms"] == 100 and 1 <= timeline["buckets"] <= MAX_BUCKETS
    assert sum(timeline["locks"]["alpha"]["wait_ns"]) <= doc["locks"]["alpha"]["wait_ns"]["sum"]


def _resealed(doc: dict[str, Any]) -> dict[str, Any]:
    doc["manifest_digest"] = compute_digest(doc)
    return doc


def _crafted(runs, edit) -> dict[str, Any]:
    doc = copy.deepcopy(json.loads(runs["ab"][1].read_text()))
    edit(doc)
    return _resealed(doc)


def _invented_site(doc):
    points = doc["locks"]["alpha"]["contention_points"]
    points["x:y:1"] = copy.deepcopy(next(iter(points.values())))


def _dropped_holder(doc):
    holders = doc["locks"]["alpha"]["contending_points"]
    del holders[next(iter(holders))]


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (_invented_site, r"contention_points must add up to the lock's contentions"),
        (_dropped_holder, r"contending_points must add up to the lock's contentions"),
        (
            lambda d: d["locks"]["alpha"].pop("contending_points"),
            r"has contention_points without contending_points",
        ),
        (
            lambda d: d["locks"]["alpha"]["contending_points"].update(
                {f"s{i}": {"count": 1, "wait_ns": 0} for i in range(300)}
            ),
            r"contending_points must have at most 257 sites, got 30\d",
        ),
        (
            lambda d: d["locks"]["alpha"]["contending_points"].update(
                {"": {"count": 1, "wait_ns": 0}}
            ),
            r"keys must be sites of 1 to 1000 chars",
        ),
        (
            lambda d: d["locks"]["beta"]["contending_points"]["__main__:hold_r:75"].update(extra=1),
            r"must be an object with exactly count, wait_ns",
        ),
        (lambda d: d["timeline"].update(width_ms=150), r"timeline.width_ms must be 100 times"),
        (lambda d: d["timeline"].update(start_ms=50), r"start_ms must be a multiple of width_ms"),
        (lambda d: d["timeline"].update(buckets=257), r"timeline.buckets must be at most 256"),
        (
            lambda d: d["timeline"]["locks"].update(ghost=d["timeline"]["locks"]["alpha"]),
            r"timeline.locks\['ghost'\] is not a lock of the data",
        ),
        (
            lambda d: d["timeline"]["locks"]["alpha"]["wait_ns"].append(0),
            r"timeline.locks\['alpha'\].wait_ns must be a list of \d+ counts",
        ),
        (
            lambda d: d["timeline"]["locks"]["alpha"]["hold_ns"].__setitem__(0, 2**62),
            r"timeline.locks\['alpha'\].hold_ns adds up to more than the lock's hold_ns.sum",
        ),
    ],
)
def test_crafted_points_and_timelines_are_refused(runs, edit, message):
    """A manifest read back is hostile input: a site invented or dropped (the tables no longer
    add up), a table without its pair, too many or nameless sites, a timeline of a width off
    the grid, misaligned, too long, naming a class the data lacks, ragged, or adding up to more
    than the class's totals: each is refused in one line naming the field."""
    doc = _crafted(runs, edit)
    with pytest.raises(ManifestError, match=r"^manifest m is invalid: .*" + message):
        check_doc(doc, "manifest m")


def _lock(points: dict[str, int]) -> dict[str, Any]:
    return {
        "contention_points": {s: LogHistogram([w]) for s, w in points.items()},
        "contending_points": {s: {"count": 1, "wait_ns": w} for s, w in points.items()},
    }


def test_the_sites_past_the_bound_fold_into_other_with_exact_totals():
    """``4 x contention_points`` sites are kept, the most wait first; the rest add up in
    ``(other)``, so the totals do not change."""
    points = {f"m:f:{i}": 1000 + i for i in range(KEEP + 10)}
    lock = _lock(points)
    trim_points(lock)
    waits = lock["contention_points"]
    assert len(waits) == KEEP + 1
    assert waits[OTHER].count == 10 and waits[OTHER].sum == sum(1000 + i for i in range(10))
    assert sum(h.sum for h in waits.values()) == sum(points.values())
    assert lock["contending_points"][OTHER] == {"count": 10, "wait_ns": waits[OTHER].sum}
    assert f"m:f:{KEEP + 9}" in waits and "m:f:0" not in waits


def _part(points: dict[str, int]) -> dict[str, Any]:
    lock = {
        "kind": "threading.Lock",
        "acquisitions": len(points),
        "contentions": len(points),
        "skipped": 0,
        "timeouts": 0,
        "wait_ns": LogHistogram(points.values()),
        "hold_ns": LogHistogram(),
        "workers": {},
        **_lock(points),
    }
    return {"locks": {"l": lock}}


def test_a_merge_with_points_and_timelines_folded_in_shares_is_the_merge(runs):
    """Points, timelines and all: folded in two shares, the same manifest."""
    ms = [load_manifest(runs[k][1]) for k in ("a", "b", "ab")]
    assert all("timeline" in m.to_dict() for m in ms)
    for cut in range(4):
        assert merged_as_shares(ms, cut) == merge_manifests(ms).to_json()


def test_merge_is_exact_and_order_free_below_the_bound():
    a = {"m:f:1": 5, "m:f:2": 7}
    b = {"m:f:2": 11, "m:f:3": 13}
    ab = merge_data([_part(a), _part(b)])["locks"]["l"]
    ba = merge_data([_part(b), _part(a)])["locks"]["l"]
    assert ab["contention_points"] == ba["contention_points"]
    assert {s: h.sum for s, h in ab["contention_points"].items()} == {
        "m:f:1": 5,
        "m:f:2": 18,
        "m:f:3": 13,
    }
    assert ab["contending_points"]["m:f:2"] == {"count": 2, "wait_ns": 18}


def test_the_timeline_doubles_its_width_and_keeps_its_sums():
    """A run longer than 256 buckets doubles the width (pairs of buckets on the epoch's
    boundaries add up): the bucket count stays bounded and no nanosecond is lost."""
    t = Timeline()
    wait = 0
    for k in range(2000):  # 200 s at one sample per 100 ms
        wait += k
        t.sample({"l": (wait, 2 * wait)}, 1_000_000_000 + 100 * k)
    doc = t.to_json()
    assert doc is not None
    assert doc["buckets"] <= MAX_BUCKETS and doc["width_ms"] == 800
    assert doc["start_ms"] % doc["width_ms"] == 0
    assert sum(doc["locks"]["l"]["wait_ns"]) == wait
    assert sum(doc["locks"]["l"]["hold_ns"]) == 2 * wait


@given(
    st.integers(0, 10**6),
    st.lists(st.tuples(st.integers(0, 400), st.integers(1, 10**9)), min_size=1, max_size=60),
)
def test_every_bucket_holds_what_ended_in_it(start_bucket, steps):
    """Against a reference: each sample's growth lands in the bucket of its time at the final
    width (however many doublings came between), bucket by bucket; the rows are allocated
    whole once, so a long run holds no more than a short one."""
    t = Timeline()
    now, total, ends = 1_000_000_000 + 100 * start_bucket, 0, []
    for gap_buckets, grown in steps:
        now += 100 * gap_buckets
        total += grown
        ends.append((now, grown))
        t.sample({"l": (total, 0)}, now)
    doc = t.to_json()
    assert doc is not None
    width, start = doc["width_ms"], doc["start_ms"]
    expected = [0] * doc["buckets"]
    for at, grown in ends:
        expected[at // width - start // width] += grown
    assert doc["locks"]["l"]["wait_ns"] == expected
    assert all(len(row) == MAX_BUCKETS for row in t.locks["l"])


def test_timelines_merge_on_the_epochs_bucket_boundaries():
    """Two processes' timelines of different widths: the merged one has the wider width, and
    every part's bucket falls in the merged bucket that contains it."""
    a = {"width_ms": 100, "start_ms": 1000, "buckets": 3, "locks": {"l": {"wait_ns": [1, 2, 3],
         "hold_ns": [0, 0, 0]}}}  # fmt: skip
    b = {"width_ms": 200, "start_ms": 1200, "buckets": 2, "locks": {"l": {"wait_ns": [10, 20],
         "hold_ns": [5, 5]}}}  # fmt: skip
    merged = merge_timelines([a, b])
    assert merged == {
        "width_ms": 200,
        "start_ms": 1000,
        "buckets": 3,
        "locks": {"l": {"wait_ns": [3, 13, 20], "hold_ns": [0, 5, 5]}},
    }
    assert merge_timelines([b, a]) == merged


def test_a_sample_reentered_on_its_thread_gives_no_timeline():
    """A signal handler's snapshot can run on the thread that is sampling, between two rows
    growing (the reentrancy stress test found a timeline whose rows had two lengths): the
    re-entered sample returns no timeline, and the outer one a consistent one."""

    class Stats:
        wait_total_ns, hold_total_ns = 5, 7

    class Cls:
        name = "a"

    timeline = Timeline()
    nested: list[dict] = []

    class Reentering:  # a worker state whose statistics are read as a handler runs
        @property
        def stats(self) -> dict:
            nested.append(timeline.sample_states([]))
            return {Cls(): Stats()}

    outer = timeline.sample_states([Reentering()])
    assert nested == [{}]
    doc = outer["timeline"]
    assert doc["locks"]["a"] == {"wait_ns": [5], "hold_ns": [7]} and doc["buckets"] == 1
