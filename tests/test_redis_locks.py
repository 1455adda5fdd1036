"""redis-py locks against a real ``redis-server``: waits, holds, leases, release failures, order.

Every test here runs against Debian's ``redis-server`` on a free loopback port (``servers.py``),
in this process (threads and asyncio tasks) or in real processes (``data/distributed_worker.py``)
whose manifests are merged.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from otel_lockwatch import PotentialDeadlockError, Verdict, merge_manifests, name_lock
from otel_lockwatch._session import RECORDER
from otel_lockwatch.manifest._evaluate import evaluate

redis = pytest.importorskip("redis")
from polling import until  # noqa: E402
from redis.backoff import NoBackoff  # noqa: E402
from redis.exceptions import LockError, LockNotOwnedError  # noqa: E402
from servers import redis_server  # noqa: E402

WORKER = Path(__file__).parent / "data" / "distributed_worker.py"


@pytest.fixture(scope="module")
def port(tmp_path_factory):
    with redis_server(tmp_path_factory.mktemp("redis")) as p:
        yield p


@pytest.fixture
def client(port):
    c = redis.Redis(port=port)
    c.flushall()
    yield c
    c.close()


def manifest():
    return evaluate(RECORDER.snapshot()).to_dict()


def gauge(watched, metric, lock):
    """A live gauge's value for one lock class (``lockwatch.lock.waiting`` / ``.holders``)."""
    points = {p.attributes["lockwatch.lock.name"]: p.value for p in watched.points(metric)}
    return points.get(lock, 0)


def make_lock(client, key, **kwargs):
    """One creation site for every lock of these tests."""
    return client.lock(key, **kwargs)


def test_an_uncontended_acquisition_is_counted_without_a_wait(watched, client):
    """A first attempt that succeeds is an acquisition with a wait of 0 and no contention; the
    hold is recorded at the release."""
    lock = make_lock(client, "lock:order:1001", timeout=10)
    with lock:
        pass
    entry = manifest()["locks"]["lock:order:*"]
    assert entry["kind"] == "redis.Lock"
    assert (entry["acquisitions"], entry["contentions"], entry["timeouts"]) == (1, 0, 0)
    assert entry["wait_ns"]["count"] == 1 and entry["wait_ns"]["sum"] == 0
    assert entry["hold_ns"]["count"] == 1
    assert entry["key_templates"] == ["lock:order:*"]
    assert entry["lease"]["overruns"] == 0


def test_a_contended_acquisition_waits_through_the_clients_polling(watched, client):
    """The second worker's first attempt fails while the first holds the lock: it is contended,
    and its wait (the client's retry polling) lasts until the holder released."""
    held, release = threading.Event(), threading.Event()

    def holder():
        with make_lock(client, "lock:order:7", timeout=10):
            held.set()
            release.wait(10)
            time.sleep(0.05)  # hold: the holder's work, after the waiter has started waiting

    t = threading.Thread(target=holder, name="holder")
    t.start()
    held.wait(10)
    lock = make_lock(client, "lock:order:7", timeout=10, sleep=0.005)
    release.set()
    t0 = time.perf_counter_ns()
    assert lock.acquire()
    wall = time.perf_counter_ns() - t0
    lock.release()
    t.join()
    entry = manifest()["locks"]["lock:order:*"]
    assert (entry["acquisitions"], entry["contentions"]) == (2, 1)
    waited = entry["workers"]["MainThread"]["wait_ns"]
    assert 0.04e9 <= waited <= wall
    # The lock's wait (the holder's wait on `release`, if it blocked, is a hand-off wait's span).
    spans = [
        s
        for s in watched.finished("lock.wait")
        if s.attributes["lockwatch.lock.kind"] == "redis.Lock"
    ]
    assert spans and spans[0].attributes["lockwatch.lock.key_template"] == "lock:order:*"


def test_blocking_timeout_is_a_timeout_and_a_nonblocking_miss_is_skipped(watched, client):
    """``blocking_timeout`` running out is a timed-out wait; ``blocking=False`` on a held lock is
    a try that found it taken."""
    holder = make_lock(client, "lock:stock:55", timeout=10)
    assert holder.acquire()
    other = make_lock(client, "lock:stock:55", timeout=10, sleep=0.01)
    assert other.acquire(blocking_timeout=0.05) is False
    assert other.acquire(blocking=False) is False
    holder.release()
    entry = manifest()["locks"]["lock:stock:*"]
    assert entry["timeouts"] == 1 and entry["skipped"] == 1 and entry["contentions"] == 1
    assert entry["acquisitions"] == 1


def test_a_hold_past_its_lease_is_an_overrun_and_the_application_keeps_its_error(watched, client):
    """Held 1.5 s on ``timeout=1``: Redis expires the key, the release raises the application's
    own ``LockNotOwnedError``, and the manifest names the class and the worker of the overrun:
    verdict LEASE_OVERRUN_DETECTED, a span event on the current span."""
    tracer = watched.tracer_provider.get_tracer("app")
    lock = make_lock(client, "lock:invoice:4f1c2b9e7d", timeout=1)
    with tracer.start_as_current_span("settle"):
        assert lock.acquire()
        time.sleep(1.5)  # hold: the slow work (a GC pause, a slow query)
        with pytest.raises(LockNotOwnedError):
            lock.release()
    doc = manifest()
    assert doc["verdict"] == "LEASE_OVERRUN_DETECTED"
    [overrun] = doc["lease_overruns"]
    assert overrun["lock"] == "lock:invoice:*" and overrun["worker"] == "MainThread"
    assert overrun["overruns"] == 1 and 400 <= overrun["overrun_ms"] <= 1500
    assert doc["release_failures"] == [{"lock": "lock:invoice:*", "not_owned": 1, "lock_error": 0}]
    [settle] = [s for s in watched.finished() if s.name == "settle"]
    events = {e.name: dict(e.attributes) for e in settle.events}
    assert events["lockwatch.lease_overrun"]["lockwatch.lock.name"] == "lock:invoice:*"
    assert events["lockwatch.lease_overrun"]["lockwatch.worker"] == "MainThread"
    assert events["lockwatch.release_failed"]["lockwatch.failure"] == "not_owned"
    assert RECORDER.thread_state().held == []
    [point] = watched.points("lockwatch.lock.lease_overruns")
    assert point.value == 1 and point.attributes["lockwatch.lock.name"] == "lock:invoice:*"
    [point] = watched.points("lockwatch.lock.release_failures")
    assert point.value == 1 and point.attributes["lockwatch.failure"] == "not_owned"


def test_extend_moves_the_lease_and_a_late_extend_is_an_overrun(watched, client):
    """An ``extend`` in time keeps the hold within its lease; one sent after the key expired is
    an overrun, and its ``LockNotOwnedError`` still reaches the application."""
    # Leases of a second: a loaded machine (the pure-Python path in a chroot beside other work)
    # once took more than the 0.2 s they had left between the acquire and the extend.
    lock = make_lock(client, "lock:job:12", timeout=1.0)
    assert lock.acquire()
    time.sleep(0.1)  # hold
    lock.extend(1.0)  # the lease now ends 2 s after the acquisition
    time.sleep(1.0)  # hold: past the first lease, within the extended one
    lock.release()
    assert manifest()["lease_overruns"] == []

    late = make_lock(client, "lock:job:13", timeout=0.2)
    before = time.perf_counter()
    assert late.acquire()
    acquired = time.perf_counter()
    time.sleep(0.4)  # hold: about 0.2 s past the lease, the overrun measured below
    slept = time.perf_counter()
    with pytest.raises(LockNotOwnedError):
        late.extend(1)
    extended = time.perf_counter()
    with pytest.raises(LockNotOwnedError):
        late.release()
    doc = manifest()
    [overrun] = doc["lease_overruns"]
    assert overrun["lock"] == "lock:job:*" and overrun["overruns"] == 1  # once per hold
    lease = doc["locks"]["lock:job:*"]["lease"]
    assert lease == {
        "overruns": 1,
        "overrun_ns": lease["overrun_ns"],
        "overrun_max_ns": lease["overrun_max_ns"],
        "workers": {"MainThread": {"overruns": 1, "overrun_ns": lease["overrun_ns"]}},
    }
    # Measured at the late extend, from the lease's end (the acquire's time + 0.2 s): within
    # what this thread's own clock saw of the hold, whatever the machine's load made of the sleep.
    assert slept - acquired - 0.2 <= lease["overrun_ns"] / 1e9 <= extended - before - 0.2


def test_releasing_a_lock_not_held_is_a_counted_lock_error(watched, client):
    """``LockError`` (nothing to release) is counted as a release failure and re-raised."""
    lock = make_lock(client, "lock:order:9", timeout=5)
    with pytest.raises(LockError, match="not owned"):
        lock.release()
    assert manifest()["release_failures"] == [
        {"lock": "lock:order:*", "not_owned": 0, "lock_error": 1}
    ]


def test_a_local_lock_under_a_redis_lock_and_the_reverse_are_order_edges(watched, client):
    """One lock-order graph across kinds: Redis lock then ``threading.Lock`` in one place, the
    reverse in another, is a cycle like any other."""
    local = name_lock(threading.Lock(), "cache")
    with make_lock(client, "lock:order:1", timeout=5), local:
        pass
    with local, make_lock(client, "lock:order:2", timeout=5):
        pass
    doc = manifest()
    edges = {(e["holding"], e["acquiring"]) for e in doc["lock_order"]["edges"]}
    assert {("lock:order:*", "cache"), ("cache", "lock:order:*")} <= edges
    assert doc["verdict"] == "CYCLIC_ORDERING_DETECTED"


def test_name_lock_names_a_redis_lock(watched, client):
    lock = name_lock(make_lock(client, "lock:order:3", timeout=5), "orders")
    with lock:
        pass
    entry = manifest()["locks"]["orders"]
    assert entry["kind"] == "redis.Lock" and entry["acquisitions"] == 1


def test_asyncio_locks_are_recorded_per_task(watched, port):
    """``redis.asyncio``'s lock: a task is a worker; the second task's wait is contended; an
    overrun names the task."""
    import redis.asyncio as aioredis

    async def main():
        client = aioredis.Redis(port=port)
        first = client.lock("lock:cart:77", timeout=10, sleep=0.01)
        second = client.lock("lock:cart:77", timeout=5, sleep=0.01)
        assert await first.acquire()
        acquired, done = asyncio.Event(), asyncio.Event()

        async def waiter():
            assert await second.acquire()
            acquired.set()
            await done.wait()
            await second.release()

        task = asyncio.create_task(waiter(), name="waiter")
        # The waiter's first attempt fails while the first holds the lease; only then is the
        # lease cut short. (With a lease of 0.2 s from the acquire, a loaded free-threaded
        # machine once ran the waiter's first attempt after it ended: no wait at all.)
        deadline = time.monotonic() + 10
        while (
            gauge(watched, "lockwatch.lock.waiting", "lock:cart:*") != 1
            and time.monotonic() < deadline
        ):
            await asyncio.sleep(0.01)  # ok: polling the gauge's count, with a deadline
        assert gauge(watched, "lockwatch.lock.waiting", "lock:cart:*") == 1
        assert await first.extend(0.05, replace_ttl=True)  # the lease ends 50 ms from here
        await asyncio.wait_for(acquired.wait(), 10)  # first's lease ran out: the waiter has it
        with pytest.raises(LockNotOwnedError):
            await first.release()
        done.set()
        await task
        await client.aclose()

    asyncio.run(main())
    doc = manifest()
    entry = doc["locks"]["lock:cart:*"]
    assert entry["kind"] == "redis.asyncio.Lock"
    assert entry["acquisitions"] == 2 and entry["contentions"] == 1
    assert entry["workers"]["task:waiter"]["contentions"] == 1
    assert [(o["lock"], o["overruns"]) for o in doc["lease_overruns"]] == [("lock:cart:*", 1)]
    assert doc["lease_overruns"][0]["worker"].startswith("task:")


def _run_workers(argvs, out):
    return [
        subprocess.Popen(
            [sys.executable, str(WORKER), *argv[:1], str(out), *argv[1:]],
            env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
        )
        for argv in argvs
    ]


def _wait(procs):
    for p in procs:
        assert p.wait(timeout=170) == 0


def _outputs(out):
    return "\n".join(p.read_text(encoding="utf-8") for p in sorted(out.iterdir()))


@pytest.mark.timeout(300)
def test_sixteen_processes_on_one_lock_merge_into_a_hot_lock(tmp_path, port, client):
    """16 processes contend on one redis-py lock (holds of 5 ms): the merged manifest finds that
    class hot, its waits match what the workers measured around ``acquire`` (within 10 %), and
    the key appears in no span, metric or manifest."""
    key = "lock:upsert:entity:8c5b2f0e-4c1d-4b7a-9a57-2b1d7d0c9f11"
    n, rounds = 16, 8
    procs = _run_workers([["redis-hot", str(port), key, str(rounds), "0.005"]] * n, tmp_path)
    for _ in range(n):  # the barrier: every worker is set up
        assert client.blpop(["ready"], timeout=150) is not None
    client.rpush("go", *range(n))
    _wait(procs)
    merged = merge_manifests(sorted(tmp_path.glob("manifest.*.json"))).to_dict()
    name = "lock:upsert:entity:*"
    assert merged["hot_lock_register"][0]["lock"] == name
    assert merged["verdict"] in ("HOT_LOCK_DETECTED", "STARVATION_OBSERVED")
    if not merged["starvation_signatures"]:
        assert merged["verdict"] == "HOT_LOCK_DETECTED"
    entry = merged["locks"][name]
    assert entry["acquisitions"] == n * rounds and entry["contentions"] > 0
    wall = sum(json.loads(p.read_text())["acquire_wall_ns"] for p in tmp_path.glob("result.*.json"))
    assert entry["wait_ns"]["sum"] == pytest.approx(wall, rel=0.10)
    text = _outputs(tmp_path) + json.dumps(merged)
    assert key not in text and "8c5b2f0e" not in text and name in text


@pytest.mark.timeout(300)
def test_an_abba_across_two_processes_is_a_cycle_in_the_merged_manifest(tmp_path, port):
    """Host A takes ``lock:order:*`` then ``lock:stock:*``, host B the reverse, on keys of their
    own (they never wait for each other): neither manifest has a cycle, the merged one does,
    with both witnesses."""
    procs = _run_workers(
        [["redis-abba", str(port), "order", "stock"], ["redis-abba", str(port), "stock", "order"]],
        tmp_path,
    )
    _wait(procs)
    paths = sorted(tmp_path.glob("manifest.*.json"))
    assert [json.loads(p.read_text())["verdict"] for p in paths] == ["LOW_CONTENTION"] * 2
    merged = merge_manifests(paths)
    assert merged.verdict is Verdict.CYCLIC_ORDERING_DETECTED
    [cycle] = merged.pre_deadlock_ordering_witness
    witnessed = {(e["holding"], e["acquiring"]): e["worker"] for e in cycle["edges"]}
    assert set(witnessed) == {("lock:order:*", "lock:stock:*"), ("lock:stock:*", "lock:order:*")}
    pids = {w.split("/")[0] for w in witnessed.values()}
    assert len(pids) == 2  # each edge witnessed in its own process


def test_under_the_raise_policy_a_redis_acquire_that_closes_a_cycle_is_refused(
    make_watched, client
):
    """``on_cycle=raise``: the Redis acquire that would close a cycle raises before its first
    attempt, so the key is never set."""
    make_watched(on_cycle="raise")
    local = name_lock(threading.Lock(), "cache")
    with make_lock(client, "lock:order:1", timeout=5), local:
        pass
    lock = make_lock(client, "lock:order:2", timeout=5)
    with local, pytest.raises(PotentialDeadlockError):
        lock.acquire()
    assert client.get("lock:order:2") is None
    assert RECORDER.thread_state().held == []


def test_asyncio_extend_in_time_is_no_overrun(watched, port):
    import redis.asyncio as aioredis

    async def main():
        client = aioredis.Redis(port=port)
        # Leases of a second, as in the threads' test above: each step has 0.9 s to spare.
        lock = client.lock("lock:cart:9", timeout=1.0)
        assert await lock.acquire()
        await asyncio.sleep(0.1)  # hold
        assert await lock.extend(1.0)  # the lease now ends 2 s after the acquisition
        await asyncio.sleep(1.0)  # hold: past the first lease, within the extended one
        assert await lock.reacquire()  # a lease of 1 s from here
        await asyncio.sleep(0.1)  # hold
        await lock.release()
        await client.aclose()

    asyncio.run(main())
    doc = manifest()
    assert doc["lease_overruns"] == [] and doc["release_failures"] == []
    assert doc["locks"]["lock:cart:*"]["lease"]["overruns"] == 0


def test_a_worker_polling_for_a_redis_lock_is_in_the_waiting_gauge(watched, client):
    """While its first attempt has failed and it polls, the waiter counts in
    ``lockwatch.lock.waiting`` for the class; once it holds, in ``lockwatch.lock.holders``."""
    holder = make_lock(client, "lock:order:5", timeout=10)
    assert holder.acquire()
    got = threading.Event()

    def waiter():
        with make_lock(client, "lock:order:5", timeout=10, sleep=0.005):
            got.set()

    t = threading.Thread(target=waiter, name="waiter")
    t.start()
    until(lambda: gauge(watched, "lockwatch.lock.waiting", "lock:order:*") == 1, "never waiting")
    assert gauge(watched, "lockwatch.lock.waiting", "lock:order:*") == 1
    assert gauge(watched, "lockwatch.lock.holders", "lock:order:*") == 1  # the main thread
    holder.release()
    t.join(10)
    assert got.is_set() and gauge(watched, "lockwatch.lock.waiting", "lock:order:*") == 0


def _kill_other_connections(client):
    """CLIENT KILL every client's connection but ``client``'s: a lost connection."""
    assert client.client_kill_filter(_type="normal", skipme=True) >= 1


def test_a_release_that_lost_its_connection_is_a_release_failure_and_ends_the_hold(
    make_watched, port, client
):
    """The lock's connection killed mid-hold (no retry): its release raises the application's
    ``ConnectionError``; the hold ends in lockwatch's books, counted as a release failure, and
    orders nothing after it: under ``on_cycle=raise`` the next lock of the class is taken as
    without lockwatch. (Regression: the failure was not counted.)"""
    from redis.retry import Retry

    make_watched(on_cycle="raise")
    lossy = redis.Redis(port=port, retry=Retry(NoBackoff(), 0), single_connection_client=True)
    lock = make_lock(lossy, "lock:order:31", timeout=5)
    assert lock.acquire()
    _kill_other_connections(client)
    with pytest.raises(redis.ConnectionError):
        lock.release()
    assert RECORDER.thread_state().held == []
    with make_lock(lossy, "lock:order:32", timeout=5), name_lock(threading.Lock(), "cache"):
        pass
    lossy.close()
    doc = manifest()
    assert doc["release_failures"] == [{"lock": "lock:order:*", "not_owned": 0, "lock_error": 1}]
    entry = doc["locks"]["lock:order:*"]
    assert (entry["acquisitions"], entry["hold_ns"]["count"]) == (2, 2)
    edges = {(e["holding"], e["acquiring"]) for e in doc["lock_order"]["edges"]}
    assert ("lock:order:*", "cache") in edges and ("lock:order:*", "lock:order:*") not in edges
    assert doc["lock_order"]["cycles"] == []


def test_an_asyncio_release_that_lost_its_connection_ends_the_hold(make_watched, port, client):
    """``redis.asyncio`` keeps the token when a release fails on a lost connection (so that it
    can be retried); lockwatch ends the hold all the same, as a release failure: no stale entry
    on the task's held stack, and the next ``async with`` of the class is not "recursive
    locking". (Regression: under ``on_cycle=raise`` every later ``async with`` of the class
    raised ``PotentialDeadlockError``.)"""
    import redis.asyncio as aioredis
    from redis.asyncio.retry import Retry

    make_watched(on_cycle="raise")

    async def main():
        lossy = aioredis.Redis(port=port, retry=Retry(NoBackoff(), 0))
        lock = lossy.lock("lock:cart:41", timeout=5)
        assert await lock.acquire()
        _kill_other_connections(client)
        with pytest.raises(redis.ConnectionError):
            await lock.release()
        assert lock.local.token is not None  # redis-py's own books: still held, retryable
        held = list(RECORDER.task_state(asyncio.current_task()).held)
        for key in ("lock:cart:42", "lock:cart:43"):
            async with lossy.lock(key, timeout=5):
                pass
        await lossy.aclose()
        return held

    assert asyncio.run(main()) == []
    doc = manifest()
    assert doc["release_failures"] == [{"lock": "lock:cart:*", "not_owned": 0, "lock_error": 1}]
    entry = doc["locks"]["lock:cart:*"]
    assert (entry["acquisitions"], entry["hold_ns"]["count"]) == (3, 3)
    edges = {(e["holding"], e["acquiring"]) for e in doc["lock_order"]["edges"]}
    assert ("lock:cart:*", "lock:cart:*") not in edges and doc["lock_order"]["cycles"] == []


def test_two_locks_past_the_template_cap_held_at_once_are_no_cycle(
    make_watched, client, monkeypatch
):
    """Past the cap of templates per kind, unrelated keys share the class ``(other)``: two of
    them held at once, or taken on either side of a local lock, make no edge and no cycle, and
    under ``on_cycle=raise`` nothing is refused. (Regression: ``(other)`` was one node of the
    graph, and two ``(other)`` locks held at once were "possible recursive locking".)"""
    from otel_lockwatch.capture import _distributed

    filler = {f"filler:{i}" for i in range(_distributed.MAX_TEMPLATES_PER_KIND)}
    monkeypatch.setattr(_distributed, "TEMPLATES", {"redis.Lock": filler})
    make_watched(on_cycle="raise")
    local = name_lock(threading.Lock(), "cache")
    first = make_lock(client, "lock:basket:1", timeout=5)
    second = make_lock(client, "lock:coupon:2", timeout=5)
    assert first._lockwatch_class.name == second._lockwatch_class.name == "(other)"
    with first, second:
        pass
    with first, local:
        pass
    with local, second:
        pass
    doc = manifest()
    edges = {(e["holding"], e["acquiring"]) for e in doc["lock_order"]["edges"]}
    assert not any("(other)" in edge for edge in edges)
    assert doc["lock_order"]["cycles"] == [] and doc["verdict"] != "CYCLIC_ORDERING_DETECTED"
    assert doc["locks"]["(other)"]["acquisitions"] == 4


def test_keys_with_ids_make_one_class_and_a_few_attribute_sets_per_shape(watched, client):
    """200 keys of each shape of id (emails, nanoids, base62 and base64 ids, tempfile names,
    UUIDs: seeded), each taken and released on the real server: one lock class per shape, and
    the metrics' attribute sets are per class, never per key; no key reaches an attribute.
    (Regression: emails, nanoids and tempfile names made a class each.)"""
    import base64
    import random
    import string

    rng = random.Random(28)
    alnum = string.ascii_letters + string.digits

    def chars(alphabet, n):
        return "".join(rng.choice(alphabet) for _ in range(n))

    shapes = {
        "lock:user:*": lambda: f"lock:user:{chars(string.ascii_lowercase, 8)}@example.com",
        "lock:job:*": lambda: f"lock:job:{chars(alnum + '_-', 21)}",
        "lock:invoice:*": lambda: f"lock:invoice:{chars(alnum, 22)}",
        "session:*": lambda: f"session:{base64.b64encode(rng.randbytes(16)).decode()}",
        "tmp*.lock": lambda: f"tmp{chars(string.ascii_lowercase + string.digits + '_', 8)}.lock",
        "lock:order:*": lambda: f"lock:order:{rng.randbytes(16).hex()}",
    }
    keys = [make() for make in shapes.values() for _ in range(200)]
    for key in keys:
        with make_lock(client, key, timeout=5):
            pass
    redis_locks = {n for n, e in manifest()["locks"].items() if e["kind"] == "redis.Lock"}
    assert redis_locks == set(shapes)
    watched.session.emitter.flush()
    attribute_sets = set()
    for rm in watched.metrics.get_metrics_data().resource_metrics:
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                for point in metric.data.data_points:
                    attrs = dict(point.attributes)
                    if attrs.get("lockwatch.lock.kind") == "redis.Lock":
                        attribute_sets.add((metric.name, frozenset(attrs.items())))
    names = {dict(attrs)["lockwatch.lock.name"] for _, attrs in attribute_sets}
    assert names == set(shapes)
    per_metric: dict[str, int] = {}
    for metric, _ in attribute_sets:
        per_metric[metric] = per_metric.get(metric, 0) + 1
    assert max(per_metric.values()) <= len(shapes)
    values = " ".join(str(v) for _, attrs in attribute_sets for _, v in attrs)
    assert not any(key in values for key in keys)
