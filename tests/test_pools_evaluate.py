"""Evaluation of hand-off waits and resource pools, on data parts with a known ground truth.

The data parts are what the recorder leaves for pools simulated event by event
(``_snapshots.PoolRun``: workers on a first-come first-served pool of slots) and for a
producer feeding idle consumers (``_snapshots.producer_consumer``). What is pinned down: a
checkout that waits for a slot is contention wherever the pool is built from (a semaphore, a
condition around a list, a LIFO queue), an idle consumer is not; an exhausted pool is a hot lock
and says what its capacity supports; one outlier wait is not starvation; the nominal pool size
is the most workers alive at once.
"""

from __future__ import annotations

import json

import pytest
from _snapshots import POOL_KINDS, PoolRun, lock_entry, locks_and_workers, pool_data
from _snapshots import producer_consumer as make_producer_consumer

from otel_lockwatch import _settings
from otel_lockwatch._settings import MAX_POOL_SIZE
from otel_lockwatch.exceptions import ManifestError
from otel_lockwatch.manifest._check import check_doc
from otel_lockwatch.manifest._evaluate import evaluate
from otel_lockwatch.manifest._io import dump_manifest, load_manifest
from otel_lockwatch.manifest._model import Verdict, compute_digest
from otel_lockwatch.manifest._pools import POOL_DERIVED_FIELDS, HandoffSplit
from otel_lockwatch.record._histogram import LogHistogram

MS = 1_000_000
POOL = "app.db:make_pool:12"
QUEUE = "app.jobs:make_queue:7"


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    for setting in _settings.SETTINGS.values():
        monkeypatch.delenv(setting.variable, raising=False)


def exhausted(kind: str = "semaphore") -> dict:
    """16 workers, 10 checkouts of 10 ms each, on a pool of 2 slots."""
    return pool_data(PoolRun(16, 2), kind)


def roomy(kind: str = "semaphore") -> dict:
    """The same 16 workers, 10 ms outside the pool between checkouts, on 16 slots."""
    return pool_data(PoolRun(16, 16, think_ns=10 * MS), kind)


# ---------------------------------------------------------------------------------------------
# Classification


def test_a_checkout_that_waits_for_a_slot_is_contention():
    """Every worker gives back what it takes: all of the pool's hand-off waits are contention."""
    run = PoolRun(16, 2)
    split = HandoffSplit(pool_data(run, "semaphore")["locks"][POOL])
    assert split.is_pool and split.idle == {} and split.idle_ns == 0
    assert split.contention_ns == sum(map(sum, run.waits.values())) > 0
    assert set(split.contention) == set(run.names)


def test_a_consumer_waiting_for_work_is_idle():
    """Consumers never put: their get-waits are idle, the queue is no resource pool."""
    data = make_producer_consumer()
    split = HandoffSplit(evaluate(data).data["locks"][QUEUE])
    assert not split.is_pool
    assert split.contention_ns == 0 and split.idle_ns > 0
    assert set(split.idle) == {f"consumer-{i}" for i in range(4)}
    assert set(split.contention) == {"producer"}


def test_a_class_is_a_pool_when_contention_is_at_least_half_its_wait():
    """Contention 60 ms against idle 60 ms is a pool; against idle 61 ms it is not. Either way
    the contention counts in the lock's wait and the idle part never does."""

    def data(idle_ms: int) -> dict:
        entry = lock_entry("threading.Condition")
        entry["signal_waits"] = {
            "count": 3,
            "timeouts": 0,
            "wait_ns": LogHistogram([30 * MS, 30 * MS, idle_ms * MS]),
            "workers": {
                "a": {"waits": 1, "wait_ns": 30 * MS, "signals": 1},
                "b": {"waits": 1, "wait_ns": 30 * MS, "signals": 4},
                "c": {"waits": 1, "wait_ns": idle_ms * MS, "signals": 0},
            },
        }
        workers = {w: {"observed_ns": 1000 * MS, "wait_ns": 0} for w in "abc"}
        return {"locks": {"cond": entry}, "workers": workers}

    half = evaluate(data(60)).to_dict()
    assert [p["name"] for p in half["resource_pools"]] == ["cond"]
    less = evaluate(data(61)).to_dict()
    assert less["resource_pools"] == []
    for doc, idle_ms in ((half, 60), (less, 61)):
        assert doc["locks"]["cond"]["wait_ms_total"] == 60.0
        assert doc["locks"]["cond"]["signal_wait_ms"] == {"contention": 60.0, "idle": idle_ms}
        (idle,) = doc["idle_waits"]
        assert (idle["name"], idle["count"], idle["total_ms"]) == ("cond", 1, idle_ms)
        assert idle["workers"] == [{"worker": "c", "waits": 1, "wait_ms": idle_ms}]
        # 60 ms of 3000 ms observed: the idle wait is not in the throughput.
        assert doc["effective_throughput_pct"] == 98.0


def test_a_pool_nobody_waited_on_is_a_pool_when_checkouts_came_back():
    """No hand-off wait at all: a semaphore whose holds were recorded is a pool (with enough
    capacity), a condition with signals only is not."""
    assert [p["name"] for p in evaluate(roomy()).to_dict()["resource_pools"]] == [POOL]
    data = roomy("condition")
    assert evaluate(data).to_dict()["resource_pools"] == []


# ---------------------------------------------------------------------------------------------
# Verdicts


@pytest.mark.parametrize("kind", POOL_KINDS)
def test_three_two_slot_pools_under_the_same_load_give_the_same_verdict(kind):
    """A semaphore, a condition around a list and a LIFO queue of 2 slots, 16 workers: the same
    hot lock, the same throughput, the same size, whatever the pool is built from: the run kept
    about 2.1 workers busy (the semaphore's and the queue's Little's law gives 2), and 2.1 x 1.1
    rounds up to 3."""
    reference = evaluate(exhausted("semaphore"))
    m = evaluate(exhausted(kind))
    assert m.verdict is Verdict.HOT_LOCK_DETECTED
    assert m.hot_lock_register == reference.hot_lock_register
    assert m.hot_lock_register[0]["lock"] == POOL
    assert m.hot_lock_register[0]["wait_share_pct"] == 100.0
    assert m.starvation_signatures == []
    assert m.effective_throughput_pct == reference.effective_throughput_pct
    assert (m.nominal_pool_size, m.recommended_pool_size) == (16, 3)
    assert m.sizing["bottlenecks"][0]["name"] == POOL


def test_an_exhausted_pool_is_reported_with_what_its_capacity_supports():
    """Each worker holds a slot through all of its work (u = 1): 2 slots support 2 workers,
    16 workers need 16 slots; the wait is exactly the simulated one."""
    run = PoolRun(16, 2)
    m = evaluate(pool_data(run, "semaphore"))
    (pool,) = m.to_dict()["resource_pools"]
    waits = sorted(v for vs in run.waits.values() for v in vs)
    assert pool["name"] == POOL and pool["kind"] == "threading.BoundedSemaphore"
    assert (pool["capacity"], pool["in_use_peak"], pool["checkouts"]) == (2, 2, 160)
    assert pool["waits"]["count"] == len(waits) == 158  # the first two found a free slot
    assert pool["waits"]["total_ms"] == sum(waits) / MS
    assert pool["waits"]["max_ms"] == waits[-1] / MS
    assert pool["hold"] == {"count": 160, "p50_ms": 10.0, "p95_ms": 10.0, "max_ms": 10.0}
    assert pool["timeouts"] == 0
    assert pool["hot"] is True and pool["wait_share_pct"] == 100.0
    assert (pool["utilization_per_worker"], pool["workers_supported"]) == (1.0, 2)
    assert (pool["capacity_needed"], pool["nominal_pool_size"]) == (16, 16)
    by_wait = sorted(run.waits.items(), key=lambda item: (-sum(item[1]), item[0]))
    assert pool["workers"] == [
        {"worker": w, "waits": len(vs), "wait_ms": sum(vs) / MS} for w, vs in by_wait
    ]
    # 2 of 16 workers work at any time: 12.5 %, plus the first round nobody waited for.
    total_observed = sum(run.observed.values())
    expected = round(100 * (1 - sum(waits) / total_observed), 3)
    assert m.effective_throughput_pct == expected
    assert 12.5 <= expected < 14


@pytest.mark.parametrize("kind", ["semaphore", "lifo_queue"])
def test_a_hot_pool_is_held_from_checkout_to_checkin(kind):
    """The hold of a pool that is a hot lock is its checkout -> checkin (10 ms), not the
    moment its mutex is held."""
    m = evaluate(exhausted(kind))
    assert m.hold_time_distribution == {
        POOL: {"count": 160, "p50_ms": 10.0, "p95_ms": 10.0, "max_ms": 10.0}
    }


def test_a_pool_with_enough_capacity_is_low_contention():
    """16 workers half of their time in the pool, 16 slots: nobody waits; u = 1/2, so the
    capacity supports 32 workers and the 16 need 8 slots on average."""
    m = evaluate(roomy())
    assert m.verdict is Verdict.LOW_CONTENTION
    assert m.effective_throughput_pct == 100.0
    (pool,) = m.to_dict()["resource_pools"]
    assert pool["waits"]["count"] == 0 and pool["hot"] is False
    assert (pool["utilization_per_worker"], pool["workers_supported"]) == (0.5, 32)
    assert pool["capacity_needed"] == 8


@pytest.mark.parametrize("kind", ["queue.Queue", "threading.Semaphore"])
def test_producer_and_idle_consumers_are_low_contention(kind):
    """Four consumers spend most of their time waiting for work: LOW_CONTENTION at 100 %, the
    waits listed as idle, no pool, no starvation."""
    data = make_producer_consumer(kind=kind)
    m = evaluate(data)
    doc = m.to_dict()
    assert m.verdict is Verdict.LOW_CONTENTION
    assert m.effective_throughput_pct == 100.0
    assert (doc["resource_pools"], m.hot_lock_register, m.starvation_signatures) == ([], [], [])
    (idle,) = doc["idle_waits"]
    signal = data["locks"][QUEUE]["signal_waits"]
    assert (idle["name"], idle["kind"], idle["count"]) == (QUEUE, kind, signal["count"])
    assert idle["total_ms"] == signal["wait_ns"].sum / MS > 3000
    assert {w["worker"] for w in idle["workers"]} == {f"consumer-{i}" for i in range(4)}


def test_an_idle_consumer_on_a_semaphore_is_not_starvation():
    """One consumer blocked 900 ms on a semaphore another worker releases: recorded as a mutex
    wait (as before hand-off waits existed) it starved; as an idle hand-off wait it is nothing."""
    as_mutex_wait, workers = locks_and_workers(
        [("producer", "sem", 0, 0)] * 3 + [("consumer", "sem", 900 * MS, 0)]
    )
    assert evaluate({"locks": as_mutex_wait, "workers": workers}).verdict is (
        Verdict.STARVATION_OBSERVED
    )
    entry = lock_entry("threading.Semaphore", {"producer": 3})
    entry["signal_waits"] = {
        "count": 1,
        "timeouts": 0,
        "wait_ns": LogHistogram([900 * MS]),
        "workers": {
            "consumer": {"waits": 1, "wait_ns": 900 * MS, "signals": 0},
            "producer": {"waits": 0, "wait_ns": 0, "signals": 1},
        },
    }
    workers = {w: {"observed_ns": 1000 * MS, "wait_ns": 0} for w in ("consumer", "producer")}
    m = evaluate({"locks": {"sem": entry}, "workers": workers})
    assert m.verdict is Verdict.LOW_CONTENTION and m.starvation_signatures == []
    assert [i["name"] for i in m.to_dict()["idle_waits"]] == ["sem"]


def test_a_worker_starved_on_a_pool_is_starvation():
    """Seven workers wait 1 ms each for a slot, the eighth 200 ms of its 1 s: contention signal
    waits count in starvation like mutex waits."""
    entry = lock_entry("threading.BoundedSemaphore")
    per_worker = {f"w{i}": {"waits": 1, "wait_ns": MS, "signals": 5} for i in range(7)}
    per_worker["w7"] = {"waits": 4, "wait_ns": 200 * MS, "signals": 5}
    entry["signal_waits"] = {
        "count": 11,
        "timeouts": 0,
        "wait_ns": LogHistogram([MS] * 7 + [50 * MS] * 4),
        "workers": per_worker,
    }
    workers = {w: {"observed_ns": 1000 * MS, "wait_ns": 0} for w in per_worker}
    m = evaluate({"locks": {POOL: entry}, "workers": workers})
    assert m.verdict is Verdict.STARVATION_OBSERVED
    assert m.starvation_signatures == [
        {"worker": "w7", "lock": POOL, "wait_ms": 200.0, "median_wait_ms": 1.0}
    ]


def test_one_outlier_wait_is_not_starvation():
    """A single 31.9 ms wait among 65,381 uncontended acquisitions of a registry lock, beside an
    exhausted pool: it is more than 5 times the median (0, floored at 0.2 ms), so the ratio
    alone made it starvation and halved the pool; at 2 % of the worker's observed time it is
    not a material share, and the verdict stays HOT_LOCK_DETECTED."""
    run = PoolRun(16, 2, tasks=20)
    data = pool_data(run, "semaphore")
    per_worker = {w: 65_381 // 16 + (i < 65_381 % 16) for i, w in enumerate(run.names)}
    registry = lock_entry("threading.Lock", per_worker, hold_ns=3_000)
    registry["contentions"] = 1
    registry["wait_ns"] = LogHistogram([0] * (65_381 - 1) + [31_900_000])
    registry["workers"]["w3"] |= {"contentions": 1, "wait_ns": 31_900_000}
    data["locks"]["app.registry:lookup:40"] = registry
    data["workers"]["w3"]["wait_ns"] = 31_900_000
    assert registry["acquisitions"] == 65_381
    share = 31_900_000 / data["workers"]["w3"]["observed_ns"]
    assert 0.015 < share < 0.025

    m = evaluate(data)
    assert m.starvation_signatures == []
    assert m.verdict is Verdict.HOT_LOCK_DETECTED
    assert [h["lock"] for h in m.hot_lock_register] == [POOL]


def test_a_long_wait_that_is_a_material_share_is_still_starvation():
    """The same 31.9 ms wait in a 300 ms life (10 %) is starvation."""
    per_worker = {f"w{i}": 100 for i in range(16)}
    registry = lock_entry("threading.Lock", per_worker, hold_ns=3_000)
    registry["wait_ns"] = LogHistogram([0] * 1599 + [31_900_000])
    registry["workers"]["w3"] |= {"contentions": 1, "wait_ns": 31_900_000}
    workers = {w: {"observed_ns": 300 * MS, "wait_ns": 0} for w in per_worker}
    workers["w3"]["wait_ns"] = 31_900_000
    m = evaluate({"locks": {"registry": registry}, "workers": workers})
    assert [(s["worker"], s["wait_ms"]) for s in m.starvation_signatures] == [("w3", 31.9)]


# ---------------------------------------------------------------------------------------------
# Nominal pool size and recommendations


def ten_batches_of_four() -> dict:
    """Ten batches of 4 threads one after the other: 40 workers, never more than 4 alive."""
    events = [(f"batch{b}-t{t}", "L", 0, MS) for b in range(10) for t in range(4)]
    locks, workers = locks_and_workers(events)
    return {"locks": locks, "workers": workers, "pool": {"nominal": None, "source": None}}


def test_the_nominal_size_is_the_most_workers_alive_at_once():
    data = ten_batches_of_four()
    old = evaluate(data)  # a data part from before peak_workers counts every worker
    assert (old.nominal_pool_size, old.pool_size_source) == (40, "observed")
    data["pool"]["peak_workers"] = 4
    m = evaluate(data)
    assert (m.nominal_pool_size, m.pool_size_source, m.recommended_pool_size) == (
        4,
        "peak_workers",
        4,
    )
    assert m.pool == {"nominal": None, "source": None, "peak_workers": 4}


def test_an_executor_or_a_configured_size_beats_the_peak():
    data = ten_batches_of_four()
    data["pool"]["peak_workers"] = 4
    assert evaluate(data, pool_size=6).nominal_pool_size == 6
    data["pool"] |= {"nominal": 8, "source": "executor"}
    assert (evaluate(data).nominal_pool_size, evaluate(data).pool_size_source) == (8, "executor")


def test_recommendations_by_the_formula():
    """H = 300 ms of holds, T = 1000 ms observed, C = 400 ms of checkout waits: u = 300 / 600
    = 1/2; capacity 3 supports 3 / u = 6 workers, 5 workers need ceil(5 u) = 3 slots. The
    bystander shares no lock with them: it is not one of the pool's workers."""
    entry = lock_entry("threading.Semaphore")
    entry["signal_waits"] = {
        "count": 4,
        "timeouts": 1,
        "wait_ns": LogHistogram([100 * MS] * 4),
        "workers": {
            "a": {"waits": 4, "wait_ns": 400 * MS, "signals": 3},
            "b": {"waits": 0, "wait_ns": 0, "signals": 3},
        },
    }
    entry["pool"] = {
        "capacity": 3,
        "in_use_peak": 3,
        "checkouts": 6,
        "hold_ns": LogHistogram([50 * MS] * 6),
    }
    workers = {"a": {"observed_ns": 600 * MS, "wait_ns": 0}}
    workers["b"] = {"observed_ns": 400 * MS, "wait_ns": 0}
    workers["bystander"] = {"observed_ns": 10_000 * MS, "wait_ns": 0}  # never used the pool
    m = evaluate({"locks": {"sem": entry}, "workers": workers}, pool_size=5)
    (pool,) = m.to_dict()["resource_pools"]
    assert pool["utilization_per_worker"] == 0.5
    assert (pool["workers_supported"], pool["capacity_needed"]) == (6, 3)
    assert pool["timeouts"] == 1
    assert pool["workers"] == [{"worker": "a", "waits": 4, "wait_ms": 400.0}]
    assert m.to_dict()["other_threads"] == {
        "count": 1,
        "observed_ms": 10_000.0,
        "names": ["bystander"],
    }


def test_recommendations_are_null_when_capacity_or_hold_is_unknown():
    """A bare condition has neither; a pool without a known capacity still says what the
    nominal workers need."""
    (cond,) = evaluate(exhausted("condition")).to_dict()["resource_pools"]
    assert (cond["capacity"], cond["hold"]) == (None, None)
    assert (cond["workers_supported"], cond["capacity_needed"]) == (None, None)
    data = exhausted("lifo_queue")
    data["locks"][POOL]["pool"]["capacity"] = None
    (queue,) = evaluate(data).to_dict()["resource_pools"]
    assert (queue["workers_supported"], queue["capacity_needed"]) == (None, 16)


# ---------------------------------------------------------------------------------------------
# The manifest: fields, files, old manifests


def test_the_fields_survive_dump_load_and_evaluating_again(tmp_path):
    m = evaluate(exhausted("lifo_queue"))
    loaded = load_manifest(dump_manifest(m, tmp_path / "m.json"))
    assert loaded == m and loaded.to_dict() == m.to_dict()
    assert loaded.data["locks"][POOL]["signal_waits"]["count"] == 158
    assert loaded.data["pool"]["peak_workers"] == 16
    assert evaluate(loaded.data, service_name="svc") == evaluate(m.data, service_name="svc")
    doc = m.to_dict()
    assert set(POOL_DERIVED_FIELDS) <= doc.keys()
    assert doc["thresholds"]["starvation_min_wait_pct_of_observed"] == 5.0


def test_a_manifest_written_before_the_pool_fields_still_loads(tmp_path):
    """No resource_pools, idle_waits, signal_waits nor peak_workers: it loads, and evaluated
    again it gives the same verdict and figures, with empty pool fields."""
    events = [(f"w{i}", "config", 2 * MS * (i % 3), MS) for i in range(8) for _ in range(5)]
    locks, workers = locks_and_workers(events)
    doc = evaluate({"locks": locks, "workers": workers}).to_dict()
    for field in POOL_DERIVED_FIELDS:
        del doc[field]
    del doc["thresholds"]["starvation_min_wait_pct_of_observed"]
    doc["schema"] = "otel-lockwatch/manifest/1"
    doc["manifest_digest"] = compute_digest(doc)
    path = tmp_path / "old.json"
    path.write_text(json.dumps(doc), encoding="utf-8")
    old = load_manifest(path)
    assert old.schema == "otel-lockwatch/manifest/4"  # evaluated again under today's rules
    again = evaluate(old.data).to_dict()
    for field in ("verdict", "hot_lock_register", "starvation_signatures", "nominal_pool_size"):
        assert again[field] == doc[field], field
    assert (again["resource_pools"], again["idle_waits"]) == ([], [])


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (
            lambda e: e["signal_waits"]["workers"]["w1"].update(signals=-1),
            r"^locks\['app\.db:make_pool:12'\]\.signal_waits\.workers\['w1'\]\.signals must be "
            r"an int >= 0, got -1$",
        ),
        (
            lambda e: e["signal_waits"]["workers"]["w2"].update(waits=True),
            r"^locks\['app\.db:make_pool:12'\]\.signal_waits\.workers\['w2'\]\.waits must be "
            r"an int >= 0, got True$",
        ),
        (
            lambda e: e["signal_waits"]["workers"]["w2"].pop("wait_ns"),
            r"^locks\['app\.db:make_pool:12'\]\.signal_waits\.workers\['w2'\]\.wait_ns must "
            r"be an int >= 0, got None$",
        ),
        (
            lambda e: e["signal_waits"].update(timeouts=500),
            r"^locks\['app\.db:make_pool:12'\]\.signal_waits\.timeouts must be at most its "
            r"count 158, got 500$",
        ),
        (
            lambda e: e["signal_waits"].update(wait_ns=[]),
            r"^locks\['app\.db:make_pool:12'\]\.signal_waits\.wait_ns: histogram must be an "
            r"object, got list$",
        ),
        (
            lambda e: e["pool"].update(capacity=1.5),
            r"^locks\['app\.db:make_pool:12'\]\.pool\.capacity must be an int >= 0 or null, "
            r"got 1\.5$",
        ),
        (
            lambda e: e.update(role=7),
            r"^locks\['app\.db:make_pool:12'\]\.role must be a str or null, got 7$",
        ),
        (
            lambda e: e.update(signal_waits="many"),
            r"^locks\['app\.db:make_pool:12'\]\.signal_waits must be an object, got str$",
        ),
    ],
)
def test_malformed_pool_fields_are_refused_by_name(edit, message):
    data = exhausted("lifo_queue")
    edit(data["locks"][POOL])
    with pytest.raises(ValueError, match=message):
        evaluate(data)


def test_malformed_peak_workers_is_refused_and_an_edited_manifest_too():
    data = exhausted()
    data["pool"]["peak_workers"] = True
    with pytest.raises(ValueError, match=r"^pool\.peak_workers must be an int >= 0, got True$"):
        evaluate(data)
    doc = evaluate(exhausted()).to_dict()
    doc["locks"][POOL]["signal_waits"]["workers"]["w1"]["signals"] = "x"
    doc["manifest_digest"] = compute_digest(doc)
    with pytest.raises(ManifestError, match=r"^m is invalid: locks\['app\.db:make_pool:12'\]"):
        check_doc(doc, "m")


def test_a_configured_size_above_the_largest_pool_is_refused():
    """evaluate() bounds ``pool_size`` as every manifest reader does (``MAX_POOL_SIZE``): else it
    would write a manifest that ``check`` and ``merge`` refuse as a forgery."""
    data = ten_batches_of_four()
    assert evaluate(data, pool_size=MAX_POOL_SIZE).nominal_pool_size == MAX_POOL_SIZE
    with pytest.raises(ValueError, match=r"^pool_size must be an integer in \[1, 1048576\]"):
        evaluate(data, pool_size=MAX_POOL_SIZE + 1)
