"""Real resource pools through the instrumentation: an exhausted pool is the hot lock, a pool
with enough connections is not.

Each pool runs the same load: 16 threads, 10 rounds each of one checkout held about 10 ms (a
query, a request, a command), all starting together. With 2 connections the pool is the
bottleneck (the run takes about 8 times longer than the work); with 16 nobody waits (there the
holds are 100 ms +-50 %, for 20 rounds: ``WELL_SIZED_HOLD_S`` says why). The pools
are the libraries' own (SQLAlchemy's ``QueuePool`` over a SQLite file, urllib3's
``HTTPConnectionPool(block=True)`` against a real HTTP server, redis-py's
``BlockingConnectionPool`` against a real ``redis-server``) and three built in the test (a
``Condition`` around a list, a ``queue.LifoQueue``, a ``BoundedSemaphore``).
"""

from __future__ import annotations

import queue
import random
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest
from servers import http_server, redis_server

from otel_lockwatch import evaluate, name_lock

WORKERS = 16
ROUNDS = 10
HOLD_S = 0.01
EXHAUSTED, ENOUGH = 2, 16
CONTENDED = ("HOT_LOCK_DETECTED", "STARVATION_OBSERVED")
# A well-sized pool's checkouts are held longer, and for varying times, so that its workers
# rarely meet at the pool's own mutex, and a wait there is a small share of a worker's life.
# With 10 ms holds the 16 came back together each round and took the mutex at once: a holder
# descheduled there (on the free-threaded build threads run at once, 16 of them on 2 cores)
# made a peer wait about 10 ms in a life of 120 ms, 8 %, over the starvation floor of 5 %
# (there, the `condition` pool: 1 run in 40 on a quiet machine; beside three busy processes of
# the same priority, 13 of 15 runs judged contended at 10 ms, 0 of 15 at 100 ms +-50 %,
# December 2026). test_pools_events.py's httpx pool showed the same at 10 ms. And its workers
# live 20 rounds (about 2 s), not 10: on the free-threaded build beside other work a holder of
# the pool's mutex is descheduled for tens of ms now and then (the interpreter's yields,
# docs/development.md), and one such wait, 44 ms on psycopg_pool's lock in a worker's life of
# under 0.9 s, passed 5 % of it (a 3.13t leg, December 2026); a real pool's workers live longer.
WELL_SIZED_HOLD_S = 0.1
WELL_SIZED_JITTER = 0.5
WELL_SIZED_ROUNDS = 20


def hold_s(ctx: dict) -> float:
    """A checkout's hold: ``ctx["hold_s"]``, drawn within ``±ctx["jitter"]`` of it (``HOLD_S``
    exactly when the context says neither)."""
    jitter = ctx.get("jitter", 0.0)
    return ctx.get("hold_s", HOLD_S) * random.uniform(1 - jitter, 1 + jitter)


def run_workers(use: Callable[[], None], workers: int = WORKERS, rounds: int = ROUNDS) -> None:
    """``workers`` threads, all starting together, each calling ``use`` ``rounds`` times."""
    barrier = threading.Barrier(workers)
    errors: list[BaseException] = []

    def work() -> None:
        try:
            barrier.wait()
            for _ in range(rounds):
                use()
        except BaseException as exc:  # handed to the test's thread
            errors.append(exc)

    threads = [threading.Thread(target=work, name=f"w{i:02d}") for i in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


# -- the pools: each a factory (size, servers) -> use() ------------------------------------
def sqlalchemy_pool(size: int, ctx: dict) -> Callable[[], None]:
    sqlalchemy = pytest.importorskip("sqlalchemy")
    from sqlalchemy.pool import QueuePool

    engine = sqlalchemy.create_engine(
        f"sqlite:///{ctx['tmp_path'] / 'pool.sqlite'}",
        poolclass=QueuePool,
        pool_size=size,
        max_overflow=0,
        pool_timeout=60,
    )
    ctx["cleanup"].append(engine.dispose)
    query = sqlalchemy.text("select 1")
    # The first connection initializes the dialect under a mutex all the others wait on (a
    # real, one-off contention): connect once first, as an application does at its start.
    with engine.connect() as conn:
        conn.execute(query)

    def use() -> None:
        with engine.connect() as conn:
            conn.execute(query)
            time.sleep(hold_s(ctx))  # hold: the rest of the transaction

    return use


def urllib3_pool(size: int, ctx: dict) -> Callable[[], None]:
    urllib3 = pytest.importorskip("urllib3")
    pool = urllib3.HTTPConnectionPool("127.0.0.1", ctx["http_port"], maxsize=size, block=True)
    ctx["cleanup"].append(pool.close)

    delay_ms, jitter_pct = round(ctx["hold_s"] * 1000), round(ctx["jitter"] * 100)
    path = f"/?delay_ms={delay_ms}&jitter_pct={jitter_pct}"

    def use() -> None:
        assert pool.request("GET", path).status == 200  # the server answers after the hold

    return use


def redis_pool(size: int, ctx: dict) -> Callable[[], None]:
    redis = pytest.importorskip("redis")
    pool = redis.BlockingConnectionPool(
        host="127.0.0.1", port=ctx["redis_port"](), max_connections=size, timeout=60
    )
    ctx["cleanup"].append(pool.disconnect)

    def use() -> None:
        conn = pool.get_connection()
        try:
            conn.send_command("PING")
            assert conn.read_response() in (b"PONG", "PONG")
            time.sleep(hold_s(ctx))  # hold: the rest of the exchange
        finally:
            pool.release(conn)

    return use


def condition_pool(size: int, ctx: dict) -> Callable[[], None]:
    cond = threading.Condition()
    free = list(range(size))

    def use() -> None:
        with cond:
            cond.wait_for(lambda: free)
            slot = free.pop()
        time.sleep(hold_s(ctx))  # hold
        with cond:
            free.append(slot)
            cond.notify()

    return use


def lifo_queue_pool(size: int, ctx: dict) -> Callable[[], None]:
    pool: queue.LifoQueue[int] = queue.LifoQueue()
    for slot in range(size):
        pool.put(slot)

    def use() -> None:
        slot = pool.get()
        time.sleep(hold_s(ctx))  # hold
        pool.put(slot)

    return use


def semaphore_pool(size: int, ctx: dict) -> Callable[[], None]:
    sem = threading.BoundedSemaphore(size)

    def use() -> None:
        with sem:
            time.sleep(hold_s(ctx))  # hold

    return use


POOLS = {
    "sqlalchemy": (sqlalchemy_pool, "sqlalchemy."),
    "urllib3": (urllib3_pool, "urllib3."),
    "redis": (redis_pool, "redis."),
    "condition": (condition_pool, "test_pools_real:condition_pool:"),
    "lifo_queue": (lifo_queue_pool, "test_pools_real:lifo_queue_pool:"),
    "semaphore": (semaphore_pool, "test_pools_real:semaphore_pool:"),
}


@pytest.fixture(scope="module")
def http_port() -> Iterator[int]:
    with http_server(delay_s=HOLD_S) as port:  # started before instrument(): not watched
        yield port


@pytest.fixture(scope="module")
def redis_port(tmp_path_factory) -> Iterator[Callable[[], int]]:
    """The port of a redis-server started on first use (a test that needs none never skips)."""
    stack: list = []
    port: list[int] = []

    def get() -> int:
        if not port:
            cm = redis_server(tmp_path_factory.mktemp("redis"))
            port.append(cm.__enter__())
            stack.append(cm)
        return port[0]

    yield get
    for cm in stack:
        cm.__exit__(None, None, None)


@pytest.fixture
def ctx(tmp_path, http_port, redis_port) -> Iterator[dict]:
    c: dict = {"tmp_path": tmp_path, "http_port": http_port, "redis_port": redis_port}
    c["cleanup"] = []
    c["hold_s"], c["jitter"] = HOLD_S, 0.0
    yield c
    for close in c["cleanup"]:
        close()


def _pool_name(manifest) -> str:
    (pool,) = manifest.to_dict()["resource_pools"]
    return pool["name"]


@pytest.mark.parametrize("kind", sorted(POOLS))
def test_an_exhausted_pool_is_the_hot_lock(watched, ctx, kind):
    """16 workers on 2 connections: the pool is hot, named where the library (or the test)
    built it, and the workers spend most of their time waiting for a connection."""
    make, where = POOLS[kind]
    use = make(EXHAUSTED, ctx)
    run_workers(use)
    manifest = evaluate()
    doc = manifest.to_dict()
    assert manifest.verdict in CONTENDED, doc["hot_lock_register"]
    hot = manifest.hot_lock_register[0]["lock"]
    assert hot.startswith(where) and not hot.startswith("queue:"), hot
    assert manifest.effective_throughput_pct < 50
    pools = {p["name"]: p for p in doc["resource_pools"]}
    assert pools[hot]["hot"] and pools[hot]["waits"]["count"] > 0
    if doc["locks"][hot]["kind"] != "threading.Condition":  # a condition knows no capacity
        assert (pools[hot]["capacity"], pools[hot]["in_use_peak"]) == (2, 2)
        assert pools[hot]["workers_supported"] <= 3


@pytest.mark.parametrize("kind", sorted(POOLS))
def test_a_pool_with_enough_connections_is_low_contention(watched, ctx, kind):
    make, _ = POOLS[kind]
    ctx["hold_s"], ctx["jitter"] = WELL_SIZED_HOLD_S, WELL_SIZED_JITTER
    use = make(ENOUGH, ctx)
    run_workers(use, rounds=WELL_SIZED_ROUNDS)
    manifest = evaluate()
    assert manifest.verdict == "LOW_CONTENTION", manifest.to_dict()["hot_lock_register"]
    assert manifest.effective_throughput_pct > 90


def test_three_two_slot_pools_give_one_verdict(make_watched, ctx):
    """A semaphore, a condition around a list and a LifoQueue of 2 slots under one load: the
    same verdict, whatever the pool is built from."""
    verdicts = {}
    for kind in ("semaphore", "condition", "lifo_queue"):
        w = make_watched()
        run_workers(POOLS[kind][0](EXHAUSTED, ctx))
        verdicts[kind] = evaluate().verdict
        w.instrumentor.uninstrument()
    assert len(set(verdicts.values())) == 1, verdicts
    assert verdicts["semaphore"] in CONTENDED


def test_a_producer_and_idle_consumers_are_low_contention(watched):
    """Four consumers waiting for work on a queue one producer fills slowly: their waits are
    idle, not contention."""
    jobs: queue.Queue[int | None] = queue.Queue()
    done: list[int] = []

    def consumer() -> None:
        while (job := jobs.get()) is not None:
            time.sleep(0.001)  # the job
            done.append(job)

    consumers = [threading.Thread(target=consumer, name=f"consumer-{i}") for i in range(4)]
    for t in consumers:
        t.start()
    for job in range(40):
        time.sleep(0.002)  # the producer's own work between two jobs
        jobs.put(job)
    for _ in consumers:
        jobs.put(None)
    for t in consumers:
        t.join()
    assert sorted(done) == list(range(40))
    manifest = evaluate()
    doc = manifest.to_dict()
    assert manifest.verdict == "LOW_CONTENTION"
    assert doc["resource_pools"] == [] and manifest.effective_throughput_pct > 90
    (idle,) = doc["idle_waits"]
    assert idle["kind"] == "queue.Queue" and len(idle["workers"]) == 4


def test_an_idle_executor_is_low_contention(watched):
    """An executor of 8 with little to do: its workers wait for work, which is no contention."""
    lock = name_lock(threading.Lock(), "counter")
    counts = [0]

    def task() -> None:
        with lock:
            counts[0] += 1

    with ThreadPoolExecutor(max_workers=8) as executor:
        for _ in range(20):
            executor.submit(task)
            time.sleep(0.002)  # the executor's workers idle between tasks
    manifest = evaluate()
    assert counts == [20]
    assert manifest.verdict == "LOW_CONTENTION"
    assert manifest.to_dict()["resource_pools"] == []
    assert manifest.effective_throughput_pct > 90


def test_two_queues_at_two_sites_are_two_classes(watched):
    """Two pools built at two sites: two classes, each named by its own line."""
    reads = lifo_queue_pool(2, {})
    writes = lifo_queue_pool(2, {})
    run_workers(reads, workers=4, rounds=3)
    writes()
    doc = evaluate().to_dict()
    queues = [name for name, lock in doc["locks"].items() if lock["kind"] == "queue.LifoQueue"]
    assert len(queues) == 1  # one site (lifo_queue_pool's line) is one class, for both pools
    first: queue.LifoQueue[int] = queue.LifoQueue()
    second: queue.LifoQueue[int] = queue.LifoQueue()
    for q in (first, second):
        q.put(1)
        q.get()
    doc = evaluate().to_dict()
    queues = [name for name, lock in doc["locks"].items() if lock["kind"] == "queue.LifoQueue"]
    assert len(queues) == 3
    assert all(name.startswith("test_pools_real:") for name in queues)


def test_ten_batches_of_four_threads_are_a_pool_of_four(watched):
    """No executor, no setting: the nominal size is the most workers alive at once (a worker
    is alive from its first watched acquisition to its end), not the 40 that ever existed."""
    use = condition_pool(4, {})  # built here, but the test's thread never takes it
    for _ in range(10):
        run_workers(use, workers=4, rounds=3)
    manifest = evaluate()
    assert manifest.pool["peak_workers"] == 4
    assert (manifest.nominal_pool_size, manifest.pool_size_source) == (4, "peak_workers")
